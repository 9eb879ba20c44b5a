"""One PDDeployment through its life on a real kind node, each step building on the last:

1. it reaches Available, and requests through its client Service go prefill -> decode with the
   Mooncake parameters (the decode finds the prefill's engine by id through its bootstrap server
   and pulls that request's KV from it);
2. a paired rollout (MTP numSpeculativeTokens 3 -> 2) under a bounded request loop: no request
   fails and no decode uses KV from the other revision;
3. a new revision whose engines refuse their config as the engine image's launcher does (exit 3,
   its one-line reason in the termination message; the images tier proves the real launcher
   refuses so, from the pod's own env and args): the kubelet reports it, the operator rolls the
   revision back (the default onFailure) and says Degraded=True RolledBack with that reason, and
   the serving pods are untouched;
4. deleting it removes every child (the real garbage collector).

The engines are the emulator image (in step 3 told to refuse: PDMTP_EMULATOR_REFUSE); the router
is the real router image.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from builders import pdd
from e2e.kindkit import Kind, LoadRun, wait_for
from pdmtp.api.vocabulary import LABEL_NAME, LABEL_REVISION, LABEL_ROLE

NAME = "pd"
BOOTSTRAP_PORT = 8998
WORKER_PORT = 17000  # pdmtp_emulator.serve.WORKER_PORT
RESULT_ENV = "PDMTP_E2E_RESULT"
"""If set, a JSON file the rollout figures are written to (hack/kind-e2e.sh prints them)."""

state: dict[str, Any] = {}


def spec_for(kind: Kind) -> dict[str, Any]:
    obj = (
        pdd(NAME)
        .set(image=kind.images.emulator, model={"name": kind.images.engine_model})
        .mtp(3, modules=3, method="deepseek_mtp")
        .router(image=kind.images.router)
        .rollout(maxSurge=1, maxUnavailable=0, drainSeconds=3)
        # Emulated engines stop at once: 3 s of serving after they are told to stop, not 60.
        .set(pod={"terminationGracePeriodSeconds": 33})
        # The decode's records are counted exactly (step 1): no request of the operator's own.
        .set(verification={"probeRequestsPerMinute": 0})
        .dict()
    )
    return obj


def revision_pods(kind: Kind, namespace: str, revision: str) -> list[dict[str, Any]]:
    return kind.pods(namespace, f"{LABEL_NAME}={NAME},{LABEL_REVISION}={revision}")


def the_pod(kind: Kind, namespace: str, revision: str, role: str) -> dict[str, Any]:
    pods = kind.pods(
        namespace, f"{LABEL_NAME}={NAME},{LABEL_REVISION}={revision},{LABEL_ROLE}={role}"
    )
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]


def test_1_available_and_requests_go_prefill_to_decode(kind: Kind, namespace: str) -> None:
    started = time.monotonic()
    kind.apply(spec_for(kind), namespace)
    kind.wait_condition(namespace, NAME, "Available", timeout=240)
    state["available_seconds"] = round(time.monotonic() - started, 1)
    revision = kind.pdd(namespace, NAME)["status"]["currentRevision"]
    state["revision"] = revision

    run = LoadRun.start(kind, namespace, NAME, max_requests=40, max_seconds=120)
    summary = run.summary()
    assert (summary["ok"], summary["failed"], summary["cross_revision"]) == (40, 0, 0), summary
    assert summary["pairs"] == {f"{revision}<-{revision} k=3<-3": 40}

    # The decode's own records: every request's KV came from the one prefill, found the way
    # vLLM's Mooncake decoder finds it (bootstrap address and engine id from the router).
    prefill = the_pod(kind, namespace, revision, "prefill")
    decode = the_pod(kind, namespace, revision, "decode")
    prefill_ip = prefill["status"]["podIP"]
    identity = kind.pod_json(namespace, prefill["metadata"]["name"], 8000, "pdmtp/identity")
    records = kind.pod_json(namespace, decode["metadata"]["name"], 8000, "pdmtp/decodes")
    assert len(records) == 40
    assert len({r["transfer_id"] for r in records}) == 40
    for record in records:
        assert record["remote_engine_id"] == identity["engine_ids"][0]
        assert record["bootstrap_addr"] == f"http://{prefill_ip}:{BOOTSTRAP_PORT}"
        assert record["worker_addr"] == f"{prefill_ip}:{WORKER_PORT}"
        assert record["prefill"] == {
            "pod": prefill["metadata"]["name"],
            "revision": revision,
            "speculative_tokens": 3,
            # k=3 over 3 MTP modules: lookahead 3, the prefill stops 2 tokens short.
            "prefill_backoff": 2,
        }
        assert record["decode"]["pod"] == decode["metadata"]["name"]

    # The in-cluster operator did this, and the leader's metrics show it.
    metrics = kind.operator_metrics()
    line = f'pdmtp_reconcile_total{{name="{NAME}",namespace="{namespace}"}}'
    counts = [float(m.split()[-1]) for m in metrics.splitlines() if m.startswith(line)]
    assert counts and counts[0] > 0, f"{line} not in the scraped metrics"


def rollout_done(kind: Kind, namespace: str, old: str, new: str) -> bool:
    status = kind.pdd(namespace, NAME).get("status", {})
    progressing = kind.condition(namespace, NAME, "Progressing") or {}
    return (
        status.get("currentRevision") == new
        and status.get("updateRevision") == new
        and progressing.get("status") == "False"
        and not revision_pods(kind, namespace, old)
    )


def test_2_paired_rollout_under_load_loses_no_request(kind: Kind, namespace: str) -> None:
    old = state["revision"]
    # Bounded in count and time; the test stops it once the rollout is over.
    run = LoadRun.start(kind, namespace, NAME, max_requests=20_000, max_seconds=420)
    run.wait_sending()
    started = time.monotonic()
    patch = json.dumps({"spec": {"speculative": {"numSpeculativeTokens": 2}}})
    kind.kubectl("-n", namespace, "patch", "pddeployment", NAME, "--type=merge", "-p", patch)

    def update_revision() -> str | None:
        rev = kind.pdd(namespace, NAME).get("status", {}).get("updateRevision")
        return rev if rev and rev != old else None

    new = wait_for(update_revision, "a new update revision", 60)
    wait_for(lambda: rollout_done(kind, namespace, old, new), f"rollout {old} -> {new}", 300)
    rollout_seconds = round(time.monotonic() - started, 1)
    run.wait_answers()  # traffic on the new revision alone
    run.stop()
    summary = run.summary()
    state["revision"] = new

    figures = {
        "requests_sent": summary["sent"],
        "requests_ok": summary["ok"],
        "requests_failed": summary["failed"],
        "cross_revision": summary["cross_revision"],
        "rollout_seconds": rollout_seconds,
        "load_seconds": summary["seconds"],
        "pairs": summary["pairs"],
        "available_seconds": state.get("available_seconds"),
        "errors": summary["errors"],
    }
    print(f"\npaired rollout {old} -> {new} under load: {json.dumps(figures, sort_keys=True)}")
    if os.environ.get(RESULT_ENV):
        Path(os.environ[RESULT_ENV]).write_text(json.dumps(figures, indent=2, sort_keys=True))

    assert summary["stopped_by"] == "stop file", "the loop ended before the rollout did"
    assert summary["failed"] == 0, summary["errors"]
    assert summary["cross_revision"] == 0, summary["pairs"]
    # The loop really spanned the rollout: both revisions answered, each with its own k.
    assert summary["pairs"].get(f"{old}<-{old} k=3<-3", 0) > 0, summary["pairs"]
    assert summary["pairs"].get(f"{new}<-{new} k=2<-2", 0) > 0, summary["pairs"]
    assert set(summary["pairs"]) == {f"{old}<-{old} k=3<-3", f"{new}<-{new} k=2<-2"}


REFUSED = 3
MISMATCH = "lookahead mismatch: operator expects 2, vLLM computes 1 (method=mtp k=2 mtp_modules=1)"
"""What the launcher says when the checkpoint has one MTP module where the spec declares three."""


def pod_states(pods: list[dict[str, Any]]) -> dict[str, tuple[str, int, bool]]:
    """name -> (uid, restarts, ready): what "untouched" compares."""
    out = {}
    for pod in pods:
        (status,) = pod["status"]["containerStatuses"]
        out[pod["metadata"]["name"]] = (
            pod["metadata"]["uid"],
            status["restartCount"],
            bool(status["ready"]),
        )
    return out


class PodWatch:
    """`kubectl get pods --watch` in the background: every version of every matching pod."""

    def __init__(self, kind: Kind, namespace: str, selector: str) -> None:
        self.cmd = [
            kind.kubectl_bin,
            f"--kubeconfig={kind.kubeconfig}",
            "-n",
            namespace,
            "get",
            "pods",
            "-l",
            selector,
            "--watch",
            "--output-watch-events",
            "-o",
            "json",
        ]
        self._seen: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)

    def __enter__(self) -> PodWatch:
        self._proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, text=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(10)
        self._thread.join(10)

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        decoder, buffer = json.JSONDecoder(), ""
        for line in self._proc.stdout:
            buffer += line
            try:
                event, end = decoder.raw_decode(buffer.lstrip())
            except json.JSONDecodeError:
                continue  # an event spans several lines
            buffer = buffer.lstrip()[end:]
            with self._lock:
                self._seen.append(event.get("object", {}))

    def seen(self) -> list[dict[str, Any]]:
        with self._lock:
            out, self._seen = self._seen, []
        return out


def refusal(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The engine container's termination as the kubelet reported it, if it exited 3."""
    for status in pod["status"].get("containerStatuses", []):
        for state in (status.get("state", {}), status.get("lastState", {})):
            terminated = state.get("terminated")
            if terminated and terminated.get("exitCode") == REFUSED:
                found: dict[str, Any] = terminated
                return found
    return None


def test_3_engine_refusing_a_mismatched_lookahead_rolls_back_and_spares_serving_pods(
    kind: Kind, namespace: str
) -> None:
    serving = state["revision"]
    before = pod_states(revision_pods(kind, namespace, serving))
    assert len(before) == 3 and all(ready for _, _, ready in before.values()), before

    # A new revision (another model revision) whose engines refuse as the launcher does when
    # the checkpoint has one MTP module where the spec says three.
    refusing = {"env": [{"name": "PDMTP_EMULATOR_REFUSE", "value": MISMATCH}]}
    patch = {
        "spec": {
            "model": {"revision": "single-module"},
            "prefill": refusing,
            "decode": refusing,
        }
    }
    kind.kubectl(
        "-n", namespace, "patch", "pddeployment", NAME, "--type=merge", "-p", json.dumps(patch)
    )

    # The default onFailure (Rollback) scales the refused revision away within a second or two
    # of the refusal: a watch sees every pod update, where polling under load could miss them.
    refusals: list[dict[str, Any]] = []
    watcher = PodWatch(kind, namespace, f"{LABEL_NAME}={NAME}")

    def rolled_back() -> dict[str, Any] | None:
        for pod in watcher.seen():
            found = refusal(pod)
            if found is not None and pod["metadata"]["labels"].get(LABEL_REVISION) != serving:
                refusals.append(found)
        cond = kind.condition(namespace, NAME, "Degraded")
        return cond if cond and cond["status"] == "True" else None

    with watcher:
        cond = wait_for(rolled_back, "Degraded=True", 180, every=0.3)
        rolled_back()  # what the watch brought since the last look
    status = kind.pdd(namespace, NAME)["status"]
    refused_revision = status["updateRevision"]
    assert refused_revision != serving
    assert cond["reason"] == "RolledBack", cond
    assert status["rollout"]["failedRevision"] == refused_revision, status["rollout"]
    assert status["rollout"]["rollbackRevision"] == serving, status["rollout"]

    # The kubelet reported the launcher's exit code and its one-line reason, and the condition
    # carries that reason.
    assert refusals, "no engine pod of the new revision was seen exiting 3"
    message = refusals[0]["message"]
    assert message.startswith("pdmtp-engine refused to start: "), message
    assert "lookahead mismatch: operator expects 2, vLLM computes 1" in message, message
    assert "lookahead mismatch: operator expects 2, vLLM computes 1" in cond["message"], cond

    # The refused revision is scaled away.
    def refused_gone() -> bool:
        return not revision_pods(kind, namespace, refused_revision)

    wait_for(refused_gone, f"revision {refused_revision}'s pods to go", 120)

    # The serving revision was left alone, and still serves.
    assert kind.pdd(namespace, NAME)["status"]["currentRevision"] == serving
    assert pod_states(revision_pods(kind, namespace, serving)) == before
    run = LoadRun.start(kind, namespace, NAME, max_requests=40, max_seconds=120)
    summary = run.summary()
    assert (summary["ok"], summary["failed"]) == (40, 0), summary
    assert summary["pairs"] == {f"{serving}<-{serving} k=2<-2": 40}


def test_4_deletion_removes_every_child(kind: Kind, namespace: str) -> None:
    uid = kind.pdd(namespace, NAME)["metadata"]["uid"]
    kinds = "deployments,replicasets,pods,services,networkpolicies,serviceaccounts"

    def children() -> list[str]:
        items = kind.get(kinds, "-n", namespace)["items"]
        return [
            f"{i['kind']}/{i['metadata']['name']}"
            for i in items
            if i["metadata"].get("labels", {}).get(LABEL_NAME) == NAME
            or any(o.get("uid") == uid for o in i["metadata"].get("ownerReferences", []))
        ]

    assert children(), "nothing to collect: the PDDeployment had no children"
    kind.kubectl("-n", namespace, "delete", "pddeployment", NAME, "--wait=true", timeout=120)
    leftovers: list[str] = []

    def gone() -> bool:
        leftovers[:] = children()
        return not leftovers

    try:
        wait_for(gone, "the garbage collector to remove every child", 120)
    except TimeoutError:
        pytest.fail(f"children left behind: {leftovers}")

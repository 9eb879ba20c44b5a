"""The verdict moving rollouts on a real kind cluster (issue 41), with emulated engines that
misbehave the ways a real pair does, under a bounded in-cluster request loop, judged by the
operator in the cluster from the engines' own metrics (it scrapes each decode's metrics port):

1. a healthy revision serves and is Verified; `pdmtp verify` exits 0;
2. (a) a canary (autoPromote) whose new revision accepts fewer drafts is rolled back by itself:
   no request fails or crosses revisions, the reason is in status and `pdmtp verify` exits 1;
3. (b) under mode Gate, a paired roll whose pulls fail never retires the old revision's pods and
   rolls back, no request failing (a failed pull is recomputed by the decode);
4. (c) a healthy canary promotes itself on its verdict and completes, and `pdmtp verify` says so;
5. (d) with two decodes, a serving decode whose pulls start failing (its emulator's knob changed
   while it serves) leaves routing at once, the other carrying the requests, and is replaced
   after: no request failing or crossing revisions, the answers it gave without the prefill's KV
   counted (issue 50's figure to beat: 770 of 5,697 over 98 s), and the revision is Verified
   again; the role goes back to one decode;
6. a canary with no traffic at all is judged on the operator's own probe requests and promotes
   itself.

Steps 2 to 4 change model.revision (a new revision the emulator does not care about) and the
decode's emulator knobs (`PDMTP_EMULATOR_*`) in one patch. The decodes recompute a prompt whose
KV pull failed (`kvTransfer.loadFailurePolicy: recompute`; vLLM's default, fail, would fail the
request instead), so every request is answered and the load client counts the ones without the
prefill's KV.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from builders import pdd
from e2e.kindkit import Kind, LoadRun, wait_for
from e2e.kindkit import serving as serves
from pdmtp.api import reasons
from pdmtp.api.vocabulary import LABEL_NAME, LABEL_REVISION, LABEL_ROLE
from pdmtp.verifyctl import EXIT_FAILED, EXIT_VERIFIED

NAME = "judged"
PDMTP = Path(sys.executable).parent / "pdmtp"
state: dict[str, Any] = {}


def spec_for(kind: Kind) -> dict[str, Any]:
    return (
        pdd(NAME)
        .set(image=kind.images.emulator, model={"name": kind.images.engine_model})
        .mtp(3, modules=3, method="deepseek_mtp")
        .set(kvTransfer={"loadFailurePolicy": "recompute"})
        .router(image=kind.images.router)
        .rollout(
            maxSurge=1,
            maxUnavailable=0,
            drainSeconds=3,
            canary={"percent": 50, "autoPromote": True},
        )
        .set(pod={"terminationGracePeriodSeconds": 33})
        .dict()
    )


def verify(kind: Kind, namespace: str, timeout: float = 0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PDMTP), "verify", NAME, "-n", namespace, "--kubeconfig", str(kind.kubeconfig),
         "--timeout", str(timeout)],
        capture_output=True,
        text=True,
        timeout=timeout + 60,
    )  # fmt: skip


def patch(kind: Kind, namespace: str, body: dict[str, Any]) -> None:
    kind.kubectl(
        "-n", namespace, "patch", "pddeployment", NAME, "--type=merge", "-p", json.dumps(body)
    )


def revisions(kind: Kind, namespace: str) -> set[str]:
    return {
        p["metadata"]["labels"][LABEL_REVISION]
        for p in kind.pods(namespace, f"{LABEL_NAME}={NAME}")
        if LABEL_REVISION in p["metadata"]["labels"]
    }


def pod_uids(kind: Kind, namespace: str, revision: str) -> set[str]:
    selector = f"{LABEL_NAME}={NAME},{LABEL_REVISION}={revision}"
    return {p["metadata"]["uid"] for p in kind.pods(namespace, selector)}


def rolled_back(kind: Kind, namespace: str, serving: str) -> dict[str, Any] | None:
    record = kind.pdd(namespace, NAME).get("status", {}).get("rollout") or {}
    done = record.get("phase") == "RolledBack" and revisions(kind, namespace) == {serving}
    return record if done else None


def faulty(revision: str, **knobs: str) -> dict[str, Any]:
    env = [{"name": f"PDMTP_EMULATOR_{k.upper()}", "value": v} for k, v in knobs.items()]
    return {"spec": {"model": {"revision": revision}, "decode": {"env": env}}}


def test_1_a_healthy_revision_is_verified(kind: Kind, namespace: str) -> None:
    kind.apply(spec_for(kind), namespace)
    kind.wait_condition(namespace, NAME, "Available", timeout=240)
    state["serving"] = kind.pdd(namespace, NAME)["status"]["currentRevision"]
    run = LoadRun.start(kind, namespace, NAME, max_requests=60, max_seconds=120)
    summary = run.summary()
    assert summary["failed"] == 0, summary["errors"]
    done = verify(kind, namespace, timeout=60)
    assert done.returncode == EXIT_VERIFIED, done.stdout + done.stderr
    assert state["serving"] in done.stdout and reasons.HANDOFF_VERIFIED in done.stdout


def under_load(
    kind: Kind,
    namespace: str,
    change: dict[str, Any] | Callable[[], None],
    until: Any,
    what: str,
) -> Any:
    """Apply `change` (a patch of the PDDeployment, or a function that makes the change) while a
    bounded request loop runs; wait for `until`; the loop's summary and what `until` returned,
    with the seconds it took."""
    run = LoadRun.start(kind, namespace, NAME, max_requests=20_000, max_seconds=400)
    run.wait_sending()
    started = time.monotonic()
    if callable(change):
        change()
    else:
        patch(kind, namespace, change)
    found = wait_for(until, what, 300, every=2.0)
    seconds = round(time.monotonic() - started, 1)
    run.wait_answers()
    run.stop()
    summary = run.summary()
    counts = {k: summary[k] for k in ("sent", "ok", "failed", "cross_revision")}
    print(f"\n{what}: {seconds}s, {json.dumps(counts)}")
    return summary, found, seconds


def test_2_a_canary_accepting_fewer_drafts_is_rolled_back(kind: Kind, namespace: str) -> None:
    serving = state["serving"]
    summary, record, _ = under_load(
        kind,
        namespace,
        faulty("r2", acceptance_rate="0.3"),
        lambda: rolled_back(kind, namespace, serving),
        "the canary rolled back",
    )
    assert summary["failed"] == 0, summary["errors"]
    assert summary["cross_revision"] == 0, summary["pairs"]
    assert record["failedVerdict"] == reasons.ACCEPTANCE_REGRESSED, record
    done = verify(kind, namespace)
    assert done.returncode == EXIT_FAILED, done.stdout + done.stderr
    assert reasons.ACCEPTANCE_REGRESSED in done.stdout


def test_3_gated_pulls_failing_never_retire_the_old_revision(kind: Kind, namespace: str) -> None:
    serving = state["serving"]
    before = pod_uids(kind, namespace, serving)
    change = faulty("r3", pull_failure_rate="0.5")
    change["spec"].update(verification={"mode": "Gate"}, rollout={"canary": None})
    summary, record, _ = under_load(
        kind,
        namespace,
        change,
        lambda: rolled_back(kind, namespace, serving),
        "the paired roll rolled back",
    )
    # A failed pull is recomputed by the decode: the request is answered (200), and the load
    # client, which checks each answer's KV provenance, sees that it carries none.
    assert all(e.startswith("no KV provenance") for e in summary["errors"]), summary["errors"]
    assert summary["ok"] > 0
    assert summary["cross_revision"] == 0, summary["pairs"]
    assert record["failedVerdict"] == reasons.KV_PULL_FAILED, record
    assert pod_uids(kind, namespace, serving) == before, "the old revision lost a pod"
    done = verify(kind, namespace)
    assert done.returncode == EXIT_FAILED and reasons.KV_PULL_FAILED in done.stdout, done.stdout


def test_4_a_healthy_canary_promotes_itself(kind: Kind, namespace: str) -> None:
    serving = state["serving"]
    change = faulty("r4")
    change["spec"]["rollout"] = {"canary": {"percent": 50, "autoPromote": True}}

    def complete() -> str | None:
        status = kind.pdd(namespace, NAME).get("status", {})
        new = status.get("currentRevision")
        done = (status.get("rollout") or {}).get("phase") == "Complete"
        return new if done and new != serving and revisions(kind, namespace) == {new} else None

    summary, new, seconds = under_load(kind, namespace, change, complete, "the canary promoted")
    assert summary["failed"] == 0, summary["errors"]
    assert summary["cross_revision"] == 0, summary["pairs"]
    done = verify(kind, namespace, timeout=60)
    assert done.returncode == EXIT_VERIFIED, done.stdout + done.stderr
    assert new in done.stdout
    print(f"healthy canary completed in {seconds}s")


def decode_pods(kind: Kind, namespace: str) -> list[dict[str, Any]]:
    return [
        p
        for p in kind.pods(namespace, f"{LABEL_NAME}={NAME},{LABEL_ROLE}=decode")
        if not p["metadata"].get("deletionTimestamp")
    ]


def test_5_a_failing_decode_leaves_routing_at_once_and_is_replaced(
    kind: Kind, namespace: str
) -> None:
    serving = kind.pdd(namespace, NAME)["status"]["currentRevision"]
    patch(kind, namespace, {"spec": {"decode": {"replicas": 2}}})
    wait_for(
        lambda: len([p for p in decode_pods(kind, namespace) if serves(p)]) == 2,
        "two decodes serving",
        180,
    )
    bad = decode_pods(kind, namespace)[0]
    name, uid = bad["metadata"]["name"], bad["metadata"]["uid"]

    def replaced() -> str | None:
        pods = decode_pods(kind, namespace)
        gone = all(
            p["metadata"]["uid"] != uid for p in kind.pods(namespace, f"{LABEL_NAME}={NAME}")
        )
        new = [p["metadata"]["name"] for p in pods if p["metadata"]["name"] != name]
        return new[-1] if gone and len(pods) == 2 and all(serves(p) for p in pods) else None

    def fail_pulls() -> None:
        tuning = kind.pod_json(namespace, name, 8000, "emulator/config", {"pull_failure_rate": 1})
        assert tuning["pull_failure_rate"] == 1, tuning

    summary, new, seconds = under_load(kind, namespace, fail_pulls, replaced, "the decode replaced")
    # The failing pod's answers were recomputed (200, no KV provenance) until it left routing.
    assert all(e.startswith("no KV provenance") for e in summary["errors"]), summary["errors"]
    assert summary["cross_revision"] == 0, summary["pairs"]
    assert kind.pdd(namespace, NAME)["status"]["currentRevision"] == serving
    events = kind.get(
        "-n", namespace, "events", "--field-selector", f"reason={reasons.REPLACING_POD}"
    )
    assert any(name in e["message"] for e in events["items"]), events["items"]
    done = verify(kind, namespace, timeout=90)
    assert done.returncode == EXIT_VERIFIED, done.stdout + done.stderr
    cost = summary["failed"]  # each answered without the prefill's KV (the errors are samples)
    print(
        f"decode {name} replaced by {new} in {seconds}s; it answered {cost} of "
        f"{summary['sent']} requests without the prefill's KV"
    )
    patch(kind, namespace, {"spec": {"decode": {"replicas": 1}}})
    wait_for(lambda: len(decode_pods(kind, namespace)) == 1, "one decode again", 180)


def probes_sent(kind: Kind, namespace: str, result: str) -> float:
    labels = f'name="{NAME}",namespace="{namespace}",result="{result}"'
    line = f"pdmtp_verification_probes_total{{{labels}}}"
    found = [x for x in kind.operator_metrics().splitlines() if x.startswith(line)]
    return float(found[0].split()[-1]) if found else 0.0


def test_6_a_canary_with_no_traffic_is_judged_on_the_operators_probes(
    kind: Kind, namespace: str
) -> None:
    """No client sends anything: the operator's own requests, through the canary's router,
    bring its verdict, and autoPromote completes the roll (a canary deployed at night)."""
    serving = kind.pdd(namespace, NAME)["status"]["currentRevision"]
    clients = kind.pods(namespace, "app.kubernetes.io/name=pdmtp-e2e-load")
    assert not [p for p in clients if p["status"].get("phase") == "Running"], "a client runs"
    before = probes_sent(kind, namespace, "ok")
    started = time.monotonic()
    patch(kind, namespace, faulty("r6"))

    def complete() -> str | None:
        status = kind.pdd(namespace, NAME).get("status", {})
        new = status.get("currentRevision")
        done = (status.get("rollout") or {}).get("phase") == "Complete"
        return new if done and new != serving and revisions(kind, namespace) == {new} else None

    new = wait_for(complete, "the canary promoted on probes", 300, every=2.0)
    seconds = round(time.monotonic() - started, 1)
    sent = probes_sent(kind, namespace, "ok") - before
    assert sent >= 8, f"{sent} probes answered: fewer than minRequests"  # the verdict needs 8
    assert probes_sent(kind, namespace, "failed") == 0
    done = verify(kind, namespace, timeout=30)
    assert done.returncode == EXIT_VERIFIED and new in done.stdout, done.stdout + done.stderr
    print(f"\ncanary with no traffic promoted on {sent:g} probes in {seconds}s")

"""The verdict on a real API server (issue 41): the operator reads each decode pod's hand-off
counts (KWOK's pod IPs are fake and never dialled: it runs with `--metrics-source dir:` and the
test writes what each revision's decodes would export), judges each revision, and acts on it:

- a canary with autoPromote whose new revision accepts fewer drafts is rolled back by itself,
  the reason in status, an event and `pdmtp verify`'s exit code; a healthy one promotes itself;
- a role-local change is held at its first new pod and judged as a revision is; one whose
  engines lack the fixed connector goes back to the Verified template;
- under mode Gate, a paired roll keeps the old revision's last pods until the new revision is
  Verified: one whose pulls fail is rolled back without the old revision ever being retired, a
  healthy one completes once its decodes have pulled enough: with no client sending, enough of
  the operator's own probe requests (recorded, never dialled).

The invariant watcher checks every Pod and Deployment event of each roll."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from builders import PDDBuilder, compat_revision, pdd
from cluster.kubehelpers import Cluster, wait_for
from demo_engines import publish
from kubernetes import client
from operator_harness import (
    OperatorProcess,
    RolloutWatcher,
    condition,
    create_pdd,
    get_pdd,
    patch_spec,
    ready_after,
    wait_settled,
)
from pdmtp.api import reasons
from pdmtp.api import vocabulary as v
from pdmtp.core.revision import role_hash
from pdmtp.verifyctl import EXIT_FAILED, EXIT_VERIFIED

PDMTP = Path(sys.executable).parent / "pdmtp"


def handoff(
    requests: int,
    backoff: int,
    *,
    failed: int = 0,
    drafts: int = 0,
    accepted: int = 0,
) -> str:
    """A decode's metrics as the engine image exports them: the fixed connector's hand-off
    counters and vLLM's failed receives and spec-decode counters."""
    labels = '{model_name="m",engine="0"}'
    series = {
        "pdmtp:kv_pulled_requests": requests,
        "pdmtp:kv_pulled_tokens": requests * 64,
        "pdmtp:kv_backoff_tokens": requests * backoff,
        "pdmtp:kv_decode_only_requests": 0,
        "vllm:mooncake_num_failed_recvs": failed,
        "vllm:spec_decode_num_drafts": drafts,
        "vllm:spec_decode_num_accepted_tokens": accepted,
    }
    return "".join(
        f"# TYPE {name}_total counter\n{name}_total{labels} {value}\n"
        for name, value in series.items()
    )


def unfixed(drafts: int = 40, accepted: int = 60) -> str:
    """A decode whose engine lacks the fixed connector: vLLM's counters, no hand-off counts."""
    labels = '{model_name="m",engine="0"}'
    series = {
        "vllm:mooncake_num_failed_recvs": 0,
        "vllm:spec_decode_num_drafts": drafts,
        "vllm:spec_decode_num_accepted_tokens": accepted,
    }
    return "".join(
        f"# TYPE {name}_total counter\n{name}_total{labels} {value}\n"
        for name, value in series.items()
    )


def growing(
    requests: int, backoff: int, *, drafts: int = 0, accepted: int = 0, seed: int = 0
) -> Callable[[], str]:
    """A decode's metrics that grow as a real engine's do: each write adds `requests` pulled
    requests and `drafts` drafts, and about `accepted` accepted tokens (within 5 %, so that the
    windows between scrapes, the verdict's evidence, vary as real traffic's do)."""
    writes = itertools.count(1)
    jitter = random.Random(seed)

    def text() -> str:
        n = next(writes)
        spread = round(accepted * jitter.uniform(-0.05, 0.05))
        return handoff(requests * n, backoff, drafts=drafts * n, accepted=accepted * n + spread)

    return text


@dataclass
class HandoffFiles:
    """What each revision's decode pods report: a thread writes `<dir>/<namespace>/<pod>.prom`
    for every decode pod of a revision in `by_revision`, each second (a revision not in it
    reports nothing, as a pod not scraped yet)."""

    api: client.ApiClient
    root: Path
    namespace: str
    name: str
    by_revision: dict[str, str | Callable[[], str]] = field(default_factory=dict)
    """Per revision, its decodes' metrics, or what makes them (read at each write)."""
    by_template: dict[str, str | Callable[[], str]] = field(default_factory=dict)
    """Per role hash (`pdmtp.io/role-hash`), before the revision's: a role-local change."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> HandoffFiles:
        (self.root / self.namespace).mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        core = client.CoreV1Api(self.api)
        while not self._stop.wait(0.5):
            try:
                pods = core.list_namespaced_pod(
                    self.namespace,
                    label_selector=f"{v.LABEL_NAME}={self.name},{v.LABEL_ROLE}=decode",
                ).items
            except Exception:
                continue
            for p in pods:
                template = (p.metadata.annotations or {}).get(v.ANNOTATION_ROLE_HASH, "")
                text = self.by_template.get(template) or self.by_revision.get(
                    (p.metadata.labels or {}).get(v.LABEL_REVISION, "")
                )
                if callable(text):
                    text = text()
                if text is not None:
                    publish(self.root, self.namespace, p.metadata.name, text)


@pytest.fixture
def judging(
    cluster: Cluster, crd: None, namespace: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The operator, scraping for verdicts every second."""
    op = OperatorProcess(
        cluster.kubeconfig,
        [namespace],
        tmp_path / "operator.log",
        extra_args=["--verification-interval-seconds", "1"],
    )
    op.start()
    yield op
    op.stop()
    print("---- operator log ----\n" + op.log_tail(150))


def verify(cluster: Cluster, namespace: str, name: str, timeout: float = 0) -> Any:
    return subprocess.run(
        [str(PDMTP), "verify", name, "-n", namespace, "--kubeconfig", str(cluster.kubeconfig),
         "--timeout", str(timeout)],
        capture_output=True,
        text=True,
        timeout=timeout + 60,
    )  # fmt: skip


def watch(cluster: Cluster, namespace: str, name: str, b: PDDBuilder) -> RolloutWatcher:
    return RolloutWatcher.watching(cluster.api_client, namespace, name, b)


def revisions(cluster: Cluster, namespace: str) -> set[str]:
    pods = client.CoreV1Api(cluster.api_client).list_namespaced_pod(namespace).items
    return {(p.metadata.labels or {}).get(v.LABEL_REVISION, "") for p in pods} - {""}


def verified(cluster: Cluster, namespace: str, name: str, status: str, reason: str) -> Any:
    last: list[Any] = [None]

    def probe() -> Any:
        c = last[0] = condition(get_pdd(cluster.api_client, namespace, name), "Verified")
        return c if c is not None and (c["status"], c["reason"]) == (status, reason) else None

    try:
        return wait_for(probe, f"Verified={status} {reason}", 90, interval=0.5)
    except TimeoutError as e:
        raise TimeoutError(f"{e}; Verified last said {last[0]}") from None


def awaiting_verdict(cluster: Cluster, namespace: str, name: str, timeout: float = 60) -> Any:
    """Wait until the roll holds the old revision's last pods for the new one's verdict."""

    def held() -> Any:
        c = condition(get_pdd(cluster.api_client, namespace, name), "Progressing")
        return c if c is not None and c["reason"] == reasons.AWAITING_VERDICT else None

    return wait_for(held, "Progressing=True AwaitingVerdict", timeout, interval=0.5)


def healthy_k3() -> Callable[[], str]:
    """numSpeculativeTokens 3 over 3 MTP modules: lookahead 3, backoff 2; 1.5 accepted per draft,
    4 requests a write (twice a second)."""
    return growing(4, 2, drafts=40, accepted=60)


def start(cluster: Cluster, files: HandoffFiles, namespace: str, b: PDDBuilder) -> str:
    create_pdd(cluster.api_client, namespace, b.dict())
    old = wait_settled(cluster.api_client, namespace, files.name)["status"]["currentRevision"]
    files.by_revision[old] = healthy_k3()
    verified(cluster, namespace, files.name, "True", reasons.HANDOFF_VERIFIED)
    return str(old)


def test_a_canary_that_accepts_fewer_drafts_is_rolled_back_and_a_healthy_one_promotes_itself(
    cluster: Cluster, namespace: str, judging: OperatorProcess
) -> None:
    name = "judged"
    b = ready_after(pdd(name).mtp(3, modules=3).prefill(replicas=2).decode(replicas=2), 500)
    b.rollout(drainSeconds=1, canary={"percent": 50, "autoPromote": True})
    b.set(verification={"mode": "Rollback"})  # the default, said: the harness reports otherwise
    with HandoffFiles(cluster.api_client, judging.metrics_dir, namespace, name) as files:
        old = start(cluster, files, namespace, b)
        done = verify(cluster, namespace, name)
        assert done.returncode == EXIT_VERIFIED, done.stdout + done.stderr
        assert old in done.stdout and "HandoffVerified" in done.stdout

        watcher = watch(cluster, namespace, name, b)
        # A rebuilt engine image drafting as before: 0.5 accepted per draft against 1.5, judged
        # once both sides have 4 windows (the operator scrapes every second).
        b.set(image="pdmtp-engine:rebuilt")
        worse = compat_revision(b.build().spec)
        files.by_revision[worse] = growing(4, 2, drafts=40, accepted=20, seed=1)
        watcher.expect(b.build().spec)
        patch_spec(cluster.api_client, namespace, name, b.dict()["spec"])
        failed = verified(cluster, namespace, name, "False", reasons.ACCEPTANCE_REGRESSED)
        assert worse in failed["message"]
        wait_for(lambda: revisions(cluster, namespace) == {old}, "the canary gone", 90)
        obj = get_pdd(cluster.api_client, namespace, name)
        record = obj["status"]["rollout"]
        assert record["failedRevision"] == worse and record["rollbackRevision"] == old
        assert record["failedVerdict"] == reasons.ACCEPTANCE_REGRESSED, record
        events = client.CoreV1Api(cluster.api_client).list_namespaced_event(namespace).items
        assert any(e.reason == "RollbackStarted" and "AcceptanceRegressed" in e.message
                   for e in events)  # fmt: skip
        done = verify(cluster, namespace, name)
        assert done.returncode == EXIT_FAILED, done.stdout + done.stderr
        assert "AcceptanceRegressed" in done.stdout

        # A healthy canary is promoted by its verdict, no `pdmtp rollout promote`.
        b.set(image="pdmtp-engine:fixed")
        better = compat_revision(b.build().spec)
        files.by_revision[better] = growing(4, 2, drafts=40, accepted=62, seed=2)
        watcher.expect(b.build().spec)
        patch_spec(cluster.api_client, namespace, name, b.dict()["spec"])
        settled = wait_settled(cluster.api_client, namespace, name, timeout=120)
        watcher.stop()
        assert settled["status"]["currentRevision"] == better
        assert watcher.violations == [], (watcher.violations[:5], watcher.views)
        done = verify(cluster, namespace, name, timeout=30)
        assert done.returncode == EXIT_VERIFIED, done.stdout + done.stderr


def test_gate_holds_the_old_revision_until_verified_and_rolls_back_failing_pulls(
    cluster: Cluster, namespace: str, judging: OperatorProcess
) -> None:
    name = "gated"
    b = ready_after(pdd(name).mtp(3, modules=3).prefill(replicas=2).decode(replicas=2), 500)
    b.rollout(drainSeconds=1).set(verification={"mode": "Gate", "probeRequestsPerMinute": 60})
    with HandoffFiles(cluster.api_client, judging.metrics_dir, namespace, name) as files:
        old = start(cluster, files, namespace, b)
        watcher = watch(cluster, namespace, name, b)

        # Pulls that fail (most of them; under vLLM's default policy each fails its request):
        # the new revision never takes the old one's last pods, and goes.
        b.mtp(2, modules=3)
        failing = compat_revision(b.build().spec)
        files.by_revision[failing] = handoff(6, 1, failed=4)
        watcher.expect(b.build().spec)
        patch_spec(cluster.api_client, namespace, name, b.dict()["spec"])
        verified(cluster, namespace, name, "False", reasons.KV_LOAD_FAILED)
        wait_for(lambda: revisions(cluster, namespace) == {old}, "the failed revision gone", 90)
        assert watcher.violations == [], (watcher.violations[:5], watcher.views)

        # Healthy, but silent at first: the roll waits for the verdict with the old revision
        # serving (the operator killed meanwhile decides the same from what it observes).
        b.mtp(4, modules=4)
        healthy = compat_revision(b.build().spec)
        watcher.expect(b.build().spec)
        patch_spec(cluster.api_client, namespace, name, b.dict()["spec"])
        awaiting_verdict(cluster, namespace, name, 90)
        judging.restart()
        awaiting_verdict(cluster, namespace, name, 30)
        assert revisions(cluster, namespace) == {old, healthy}
        files.by_revision[healthy] = handoff(2, 3)  # 4 over both decodes: too few yet
        verified(cluster, namespace, name, "Unknown", reasons.AWAITING_REQUESTS)
        assert revisions(cluster, namespace) == {old, healthy}
        # No client sends more: the operator's own probes do, through the new revision's router
        # (recorded to a file, never dialled: the pod IPs are KWOK's), and each one that the
        # decodes "served" counts as a pulled request, until the verdict is reached.
        probes = judging.metrics_dir / namespace / f"{name}.probes"

        def sent() -> list[Any]:
            text = probes.read_text() if probes.exists() else ""
            return [json.loads(x) for x in text.splitlines()]

        def to(revision: str) -> list[Any]:
            return [p for p in sent() if p["revision"] == revision]

        files.by_revision[healthy] = lambda: handoff(2 + len(to(healthy)), 3)
        started = time.monotonic()
        settled = wait_settled(cluster.api_client, namespace, name, timeout=120)
        watcher.stop()
        assert settled["status"]["currentRevision"] == healthy
        assert revisions(cluster, namespace) == {healthy}
        assert watcher.violations == [], (watcher.violations[:5], watcher.views)
        # Each probe through the revision's own router; the serving revision, which the new
        # one is compared with, probed beside it (the probes weigh on both sides alike).
        assert {p["revision"] for p in sent()} <= {healthy, old}, sent()
        for revision in (healthy, old):
            routers = {p["router"] for p in to(revision)}
            assert all(r.startswith(f"{name}-{revision}-router-") for r in routers), routers
        # 60 a minute, one at a time: never more than one a second per revision.
        assert 2 <= len(to(healthy)) <= time.monotonic() - started + 2, len(to(healthy))
        assert len(to(old)) <= time.monotonic() - started + 2, len(to(old))


def test_the_default_mode_holds_the_smallest_deployment_for_its_verdict(
    cluster: Cluster, namespace: str, judging: OperatorProcess
) -> None:
    """1 prefill, 1 decode, mode Rollback (the default): a roll whose pulls fail is rolled back
    with the old revision's pods never touched (before, its router and pods were gone before
    the verdict came); a silent one waits for its verdict until the progress deadline, and then
    goes on unverified, said in a Warning and in the status."""
    name = "single"
    b = ready_after(pdd(name).mtp(3, modules=3), 500)
    b.rollout(drainSeconds=1, progressDeadlineSeconds=20).set(verification={"mode": "Rollback"})
    core = client.CoreV1Api(cluster.api_client)

    def uids(revision: str) -> set[str]:
        pods = core.list_namespaced_pod(namespace, label_selector=f"{v.LABEL_REVISION}={revision}")
        return {p.metadata.uid for p in pods.items}

    with HandoffFiles(cluster.api_client, judging.metrics_dir, namespace, name) as files:
        old = start(cluster, files, namespace, b)
        serving = uids(old)
        assert len(serving) == 3, serving  # prefill, decode, router
        watcher = watch(cluster, namespace, name, b)

        def roll_to(k: int) -> str:
            """Roll to MTP k; the new decodes report nothing yet, so once its pods are Ready the
            roll waits for the verdict with the old revision's pods untouched."""
            b.mtp(k, modules=3)
            watcher.expect(b.build().spec)
            patch_spec(cluster.api_client, namespace, name, b.dict()["spec"])
            awaiting_verdict(cluster, namespace, name)
            assert uids(old) == serving
            return compat_revision(b.build().spec)

        failing = roll_to(2)
        files.by_revision[failing] = handoff(6, 1, failed=4)
        verified(cluster, namespace, name, "False", reasons.KV_LOAD_FAILED)
        wait_for(lambda: revisions(cluster, namespace) == {old}, "the failed revision gone", 90)
        assert uids(old) == serving

        silent = roll_to(1)
        settled = wait_settled(cluster.api_client, namespace, name, timeout=90)
        watcher.stop()
        assert settled["status"]["currentRevision"] == silent
        assert "no verdict within 20s" in settled["status"]["rollout"]["verdictWaived"]
        events = core.list_namespaced_event(namespace).items
        assert any(e.reason == reasons.VERDICT_WAIVED and silent in e.message for e in events)
        assert watcher.violations == [], (watcher.violations[:5], watcher.views)


def test_a_role_local_change_is_held_at_its_first_new_pod_and_goes_back_if_it_fails(
    cluster: Cluster, namespace: str, judging: OperatorProcess
) -> None:
    """Mode Gate, 2 decodes (issue 50, item 3): a decode env change whose engines lack the fixed
    connector is held by the Deployment controller itself at its first new pod (the operator's
    minReadySeconds), judged against the old template, and the Deployment goes back to the
    Verified template with the old decodes never touched; a healthy change then rolls through
    once its first new pod is Verified."""
    name = "local"
    b = ready_after(pdd(name).mtp(3, modules=3).decode(replicas=2), 500)
    b.rollout(drainSeconds=1).set(verification={"mode": "Gate"})
    core = client.CoreV1Api(cluster.api_client)
    apps = client.AppsV1Api(cluster.api_client)

    def decodes() -> dict[str, str]:
        pods = core.list_namespaced_pod(namespace, label_selector=f"{v.LABEL_ROLE}=decode").items
        return {
            p.metadata.uid: (p.metadata.annotations or {}).get(v.ANNOTATION_ROLE_HASH, "")
            for p in pods
            if p.metadata.deletion_timestamp is None
        }

    def roll(phase: str) -> Any:
        rolls = get_pdd(cluster.api_client, namespace, name)["status"].get("templateRolls") or []
        return next((r for r in rolls if r["phase"] == phase), None)

    def change(value: str) -> str:
        env = [{"name": "PDMTP_EMULATOR_FIXED_CONNECTOR", "value": value}]
        b.decode(env=env)
        patch_spec(cluster.api_client, namespace, name, b.dict()["spec"])
        return role_hash(b.build().spec, "decode")

    with HandoffFiles(cluster.api_client, judging.metrics_dir, namespace, name) as files:
        old = start(cluster, files, namespace, b)
        before = decodes()
        assert len(before) == 2, before
        broken = change("0")
        files.by_template[broken] = unfixed()
        failed = wait_for(lambda: roll("Failed"), "the broken template Failed", 90, interval=0.5)
        assert failed["reason"] == reasons.HANDOFF_NOT_REPORTED, failed
        verified(cluster, namespace, name, "False", reasons.HANDOFF_NOT_REPORTED)
        wait_for(lambda: decodes() == before, "the decodes back to the old pods only", 60)
        deployment = apps.read_namespaced_deployment(f"{name}-{old}-decode", namespace)
        template = deployment.spec.template.metadata.annotations[v.ANNOTATION_ROLE_HASH]
        assert template == failed["verifiedTemplate"] == next(iter(before.values()))
        events = core.list_namespaced_event(namespace).items
        said = [e.reason for e in events]
        assert reasons.TEMPLATE_HELD in said and reasons.TEMPLATE_ROLLED_BACK in said, said

        fixed = change("1")
        files.by_template[fixed] = healthy_k3()
        wait_for(
            lambda: set(decodes().values()) == {fixed} and len(decodes()) == 2,
            "the healthy template rolled through",
            120,
        )
        verified(cluster, namespace, name, "True", reasons.HANDOFF_VERIFIED)
        assert not get_pdd(cluster.api_client, namespace, name)["status"].get("templateRolls")
        said = [e.reason for e in core.list_namespaced_event(namespace).items]
        assert reasons.TEMPLATE_VERIFIED in said, said

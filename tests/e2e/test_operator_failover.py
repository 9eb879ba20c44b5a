"""kind e2e: the operator fails over in the middle of a paired rollout under load (issue 31).

deploy/ runs two operator replicas that elect a leader on the Lease pdmtp-system/pdmtp-operator
(15 s lease, 10 s renew deadline). Real router, emulated engines, the in-cluster load client; a
watcher checks the rollout invariants at every watch event (the cluster tier's checker).

1. the leading operator's pod deleted during a paired MTP rollout (k 3 -> 2): it hands the Lease
   back on its way out, the standby leads within seconds and finishes the roll: 0 failed, 0
   cross-revision, 0 invariant violations;
2. the leader frozen (SIGSTOP to its container, as a paused VM or a stalled node would) during
   the roll back (k 2 -> 3): the standby leads once the lease has run out (measured), finishes
   the roll: 0 failed, 0 cross-revision, 0 invariant violations; the frozen leader, resumed,
   finds its fence closed and exits 3 (its container's last state). That it lands no write is
   proven on the API server's audit log in the cluster tier (tests/cluster/test_leader_election.py).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from builders import PDDBuilder, compat_revision, pdd
from cluster.operator_harness import RolloutWatcher
from e2e.kindkit import OPERATOR_NAMESPACE, OPERATOR_SELECTOR, Figures, Kind, LoadRun, wait_for
from kubernetes import config as kube_config
from pdmtp.core.agreement import check
from pdmtp.core.rollout.steering import target_and_policy
from pdmtp.manager import LOST_LEASE_EXIT

NAME = "failover"
LEASE_SECONDS = 15.0
RETRY_SECONDS = 2.0
record = Figures("PDMTP_E2E_FAILOVER_RESULT").record
state: dict[str, Any] = {}


def builder(kind: Kind, k: int) -> PDDBuilder:
    return (
        pdd(NAME)
        .set(image=kind.images.emulator, model={"name": kind.images.engine_model})
        .mtp(k, modules=3, method="deepseek_mtp")
        .prefill(replicas=1)
        .decode(replicas=1)
        .router(image=kind.images.router, resources={"requests": {"cpu": "100m"}})
        .rollout(maxSurge=1, maxUnavailable=0, drainSeconds=3)
        .set(pod={"terminationGracePeriodSeconds": 33})
        .unjudged()  # its rolls carry no load to judge them by
    )


@pytest.fixture(scope="module")
def api(kind: Kind) -> Iterator[Any]:
    client = kube_config.new_client_from_config(config_file=str(kind.kubeconfig))  # type: ignore[no-untyped-call]
    yield client
    client.close()


def lease_holder(kind: Kind) -> str:
    try:
        return kind.operator_leader()
    except Exception:
        return ""


def operator_pod(kind: Kind, name: str) -> dict[str, Any]:
    pod: dict[str, Any] = kind.get("pod", "-n", OPERATOR_NAMESPACE, name)
    return pod


def rolling_to(kind: Kind, namespace: str, revision: str) -> bool:
    """The roll has begun: the new revision's engine pods exist."""
    return bool(kind.pods(namespace, f"pdmtp.io/name={NAME},pdmtp.io/revision={revision}"))


def roll(kind: Kind, api: Any, namespace: str, k: int, disrupt: Any) -> dict[str, Any]:
    """Roll to MTP k under load, calling `disrupt()` once the new revision's pods exist;
    returns the figures (load, invariants, what `disrupt` measured)."""
    old = state["spec"]
    new = builder(kind, k)
    revision = compat_revision(new.build().spec)
    watcher = RolloutWatcher(api, namespace, NAME, target_and_policy(check(old))[1])
    watcher.start(old)
    run = LoadRun.start(kind, namespace, NAME, max_requests=40_000, max_seconds=400)
    run.wait_sending()
    watcher.expect(new.build().spec)
    started = time.monotonic()
    kind.apply(new.dict(), namespace)
    wait_for(lambda: rolling_to(kind, namespace, revision), "the roll begun", 120, every=0.2)
    measured = disrupt()
    wait_for(
        lambda: (
            kind.settled(namespace, NAME)
            and kind.pdd(namespace, NAME)["status"].get("currentRevision") == revision
        ),
        f"the roll to {revision} done",
        300,
    )
    roll_seconds = time.monotonic() - started
    run.wait_answers()  # on the new revision alone
    run.stop()
    summary = run.summary()
    watcher.stop()
    state["spec"] = new.build().spec
    return {
        **measured,
        "roll_seconds": round(roll_seconds, 1),
        "requests_sent": summary["sent"],
        "requests_failed": summary["failed"],
        "cross_revision": summary["cross_revision"],
        "errors": summary["errors"],
        "invariant_violations": len(watcher.violations),
        "violations": watcher.violations[:3],
    }


def test_1_the_leaders_pod_deleted_mid_roll(kind: Kind, api: Any, namespace: str) -> None:
    first = builder(kind, 3)
    kind.apply(first.dict(), namespace)
    wait_for(lambda: kind.settled(namespace, NAME), "1P/1D serving", 300)
    state["spec"] = first.build().spec

    def delete_leader() -> dict[str, Any]:
        leader = kind.operator_leader()
        deleted = time.monotonic()
        kind.kubectl("-n", OPERATOR_NAMESPACE, "delete", "pod", leader, "--wait=false")
        new = wait_for(
            lambda: (h := lease_holder(kind)) and h != leader and h, "a new leader", 60, 0.2
        )
        return {"deleted": leader, "new_leader": new, "new_leader_after_s": _since(deleted)}

    figures = roll(kind, api, namespace, 2, delete_leader)
    record("leader pod deleted during a paired rollout", figures)
    assert figures["requests_failed"] == 0, figures["errors"]
    assert figures["cross_revision"] == 0
    assert figures["invariant_violations"] == 0, figures["violations"]
    # Handed back on SIGTERM: no lease to wait out (a look of the standby, and the API's pace).
    assert figures["new_leader_after_s"] < LEASE_SECONDS
    wait_for(lambda: len(_ready_operators(kind)) == 2, "the replacement standby Ready", 180)


def test_2_the_leader_frozen_mid_roll(kind: Kind, api: Any, namespace: str) -> None:
    runtime = os.environ.get("PDMTP_E2E_NODE_RUNTIME", "podman")

    def freeze_leader() -> dict[str, Any]:
        leader = kind.operator_leader()
        pod = operator_pod(kind, leader)
        node = pod["spec"]["nodeName"]
        container = pod["status"]["containerStatuses"][0]["containerID"].split("//", 1)[1]
        restarts = pod["status"]["containerStatuses"][0]["restartCount"]

        def signal(name: str) -> None:
            subprocess.run(
                [
                    runtime,
                    "exec",
                    node,
                    "ctr",
                    "-n",
                    "k8s.io",
                    "tasks",
                    "kill",
                    "-s",
                    name,
                    container,
                ],
                check=True,
                capture_output=True,
                timeout=30,
            )

        signal("SIGSTOP")
        frozen = time.monotonic()
        try:
            new = wait_for(
                lambda: (h := lease_holder(kind)) and h != leader and h, "a new leader", 60, 0.2
            )
            took_over = _since(frozen)
        finally:
            signal("SIGCONT")
        resumed = time.monotonic()

        def exited() -> int | None:
            status = operator_pod(kind, leader)["status"]["containerStatuses"][0]
            if status["restartCount"] <= restarts:
                return None
            return int(status["lastState"]["terminated"]["exitCode"])

        code = wait_for(exited, "the resumed leader's exit", 120, 0.5)
        return {
            "frozen": leader,
            "new_leader": new,
            "new_leader_after_s": took_over,
            "resumed_leader_exit_code": code,
            "resumed_leader_exited_after_s": _since(resumed),
        }

    figures = roll(kind, api, namespace, 3, freeze_leader)
    record("leader frozen (SIGSTOP) during a paired rollout", figures)
    assert figures["requests_failed"] == 0, figures["errors"]
    assert figures["cross_revision"] == 0
    assert figures["invariant_violations"] == 0, figures["violations"]
    # A whole lease from the standby's last sight of a renewal, and at most one more look.
    assert figures["new_leader_after_s"] >= LEASE_SECONDS - RETRY_SECONDS
    assert figures["new_leader_after_s"] <= LEASE_SECONDS + 2 * RETRY_SECONDS + 3
    assert figures["resumed_leader_exit_code"] == LOST_LEASE_EXIT
    kind.kubectl("-n", namespace, "delete", "pddeployment", NAME, "--wait=true", timeout=180)


def _since(t: float) -> float:
    return round(time.monotonic() - t, 2)


def _ready_operators(kind: Kind) -> list[str]:
    return [
        p["metadata"]["name"]
        for p in kind.pods(OPERATOR_NAMESPACE, OPERATOR_SELECTOR)
        if not p["metadata"].get("deletionTimestamp")
        and all(s.get("ready") for s in p["status"].get("containerStatuses") or [{}])
    ]

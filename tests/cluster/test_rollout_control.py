"""Rollout control on a real API server: progress deadline, automatic rollback after an engine
refusal with the old revision never losing its floor, pause/resume, canary hold and promote,
undo to a recorded revision, scaling mid-roll, a full cluster, one-replica roles; driven with
the `pdmtp rollout` commands where a user would."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from builders import PDDBuilder, compat_revision, pdd
from cluster.kubehelpers import Cluster, wait_for
from kubernetes import client
from operator_harness import (
    READY_DELAY,
    OperatorProcess,
    RolloutWatcher,
    condition,
    create_pdd,
    engine_refusal,
    get_pdd,
    patch_spec,
    ready_after,
    settled,
    wait_settled,
)
from pdmtp.api import vocabulary as v

PDMTP = Path(sys.executable).parent / "pdmtp"
REFUSE = engine_refusal("lookahead mismatch: operator expects 2, vLLM computes 1")


def progressing(cluster: Cluster, namespace: str, name: str, reason: str, timeout: float) -> Any:
    return wait_for(
        lambda: (
            (c := condition(get_pdd(cluster.api_client, namespace, name), "Progressing"))
            and c["reason"] == reason
            and c
        ),
        f"Progressing reason {reason}",
        timeout,
        interval=0.3,
    )


def watch(cluster: Cluster, namespace: str, name: str, b: PDDBuilder) -> RolloutWatcher:
    return RolloutWatcher.watching(cluster.api_client, namespace, name, b)


def cli(
    cluster: Cluster, namespace: str, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PDMTP), "rollout", *args, "-n", namespace, "--kubeconfig", str(cluster.kubeconfig)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def deployments(cluster: Cluster, namespace: str) -> dict[str, client.V1Deployment]:
    items = client.AppsV1Api(cluster.api_client).list_namespaced_deployment(namespace).items
    return {d.metadata.name: d for d in items}


def events(cluster: Cluster, namespace: str, name: str) -> list[client.CoreV1Event]:
    items = client.CoreV1Api(cluster.api_client).list_namespaced_event(namespace).items
    return [e for e in items if e.involved_object.name == name]


def test_an_engine_refusal_rolls_back_and_the_old_revision_keeps_its_floor(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    b = ready_after(
        pdd("back")
        .mtp(3, modules=3)
        .prefill(replicas=2)
        .decode(replicas=2)
        .rollout(maxSurge=1, maxUnavailable=0, drainSeconds=2),
        700,
    )
    create_pdd(cluster.api_client, namespace, b.dict())
    old = wait_settled(cluster.api_client, namespace, "back")["status"]["currentRevision"]
    watcher = watch(cluster, namespace, "back", b)
    b.mtp(2, modules=3).prefill(podAnnotations={READY_DELAY: "700", **REFUSE})
    failed = compat_revision(b.build().spec)
    watcher.expect(b.build().spec)
    patch_spec(cluster.api_client, namespace, "back", b.dict()["spec"])
    # The operator killed while the failing revision starts: the rollback decided after the
    # restart comes from what it observes.
    wait_for(lambda: f"back-{failed}-prefill" in deployments(cluster, namespace), "roll begun", 30)
    operator.restart()
    aborted = progressing(cluster, namespace, "back", "RolloutAborted", 90)
    wait_for(
        lambda: not [n for n in deployments(cluster, namespace) if failed in n],
        "the failed revision's Deployments gone",
        60,
    )
    watcher.stop()
    assert watcher.violations == [], (watcher.violations[:5], watcher.views)
    obj = get_pdd(cluster.api_client, namespace, "back")
    degraded = condition(obj, "Degraded")
    assert degraded is not None and degraded["reason"] == "RolledBack"
    assert "lookahead mismatch" in degraded["message"] and old in aborted["message"]
    assert (
        obj["status"]["currentRevision"] == old and condition(obj, "Available")["status"] == "True"
    )  # type: ignore[index]
    assert obj["status"]["rollout"]["failedRevision"] == failed
    assert any(
        e.reason == "RollbackStarted" and e.type == "Warning"
        for e in events(cluster, namespace, "back")
    )
    # `pdmtp rollout status` says it failed, with a non-zero exit.
    done = cli(cluster, namespace, "status", "back", "--timeout", "20")
    assert done.returncode == 1 and "RolloutAborted" in done.stdout, done.stdout
    # The spec was not rewritten; a new spec change starts a new rollout.
    assert (
        get_pdd(cluster.api_client, namespace, "back")["spec"]["speculative"][
            "numSpeculativeTokens"
        ]
        == 2
    )
    b.prefill(podAnnotations={READY_DELAY: "700"})
    spec = b.dict()["spec"]
    # A merge patch keeps keys it does not name: remove the refusal's annotations explicitly.
    spec["prefill"]["podAnnotations"].update(dict.fromkeys(REFUSE))
    patch_spec(cluster.api_client, namespace, "back", spec)
    assert wait_settled(cluster.api_client, namespace, "back")["status"][
        "currentRevision"
    ] == compat_revision(b.build().spec)


def test_a_decode_refusal_rolls_back_without_removing_a_serving_pod(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    """Issue 31's rollback finding, as reported: 1P/2D, maxUnavailable 0, the new decode pods
    refusing their config. Every engine pod of the serving revision that was there before the
    roll is there, never marked to leave, when the rollback is done; the watcher saw the floor
    hold."""
    b = ready_after(
        pdd("back1p2d")
        .mtp(3, modules=3)
        .prefill(replicas=1)
        .decode(replicas=2)
        .rollout(maxSurge=1, maxUnavailable=0, drainSeconds=2),
        700,
    )
    create_pdd(cluster.api_client, namespace, b.dict())
    old = wait_settled(cluster.api_client, namespace, "back1p2d")["status"]["currentRevision"]
    core = client.CoreV1Api(cluster.api_client)

    def serving_engines() -> dict[str, str]:
        return {
            p.metadata.uid: p.metadata.name
            for p in core.list_namespaced_pod(namespace).items
            if p.metadata.labels.get(v.LABEL_REVISION) == old
            and p.metadata.labels.get(v.LABEL_ROLE) in v.ENGINE_ROLES
            and not p.metadata.deletion_timestamp
            and v.ANNOTATION_LEAVING not in (p.metadata.annotations or {})
        }

    before = serving_engines()
    assert len(before) == 3
    watcher = watch(cluster, namespace, "back1p2d", b)
    b.mtp(2, modules=3).decode(podAnnotations={READY_DELAY: "700", **REFUSE})
    failed = compat_revision(b.build().spec)
    watcher.expect(b.build().spec)
    patch_spec(cluster.api_client, namespace, "back1p2d", b.dict()["spec"])
    progressing(cluster, namespace, "back1p2d", "RolloutAborted", 90)
    wait_for(
        lambda: not [n for n in deployments(cluster, namespace) if failed in n],
        "the failed revision's Deployments gone",
        60,
    )
    watcher.stop()
    assert watcher.violations == [], (watcher.violations[:5], watcher.views)
    assert serving_engines() == before, "a pod of the serving revision was removed"


def test_the_progress_deadline_fails_a_stalled_rollout_and_holds(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    b = (
        pdd("stall")
        .mtp(3, modules=3)
        .rollout(
            maxSurge=1,
            maxUnavailable=0,
            drainSeconds=1,
            progressDeadlineSeconds=10,
            onFailure="Hold",
        )
    )
    create_pdd(cluster.api_client, namespace, b.dict())
    old = wait_settled(cluster.api_client, namespace, "stall")["status"]["currentRevision"]
    # The new revision's pods fit no node.
    b.mtp(2, modules=3).decode(nodeSelector={"pdmtp.io/no-such-node": "x"})
    patch_spec(cluster.api_client, namespace, "stall", b.dict()["spec"])
    started = time.monotonic()
    exceeded = progressing(cluster, namespace, "stall", "ProgressDeadlineExceeded", 60)
    took = time.monotonic() - started
    print(f"deadline exceeded after {took:.1f}s: {exceeded['message']}")
    assert exceeded["status"] == "False" and took >= 10
    assert "cannot place" in exceeded["message"] and "node affinity/selector" in exceeded["message"]
    assert "maxSurge: 0" not in exceeded["message"], "no capacity advice for a selector mismatch"
    obj = get_pdd(cluster.api_client, namespace, "stall")
    assert (
        obj["status"]["currentRevision"] == old and condition(obj, "Available")["status"] == "True"
    )  # type: ignore[index]
    assert any(compat_revision(b.build().spec) in n for n in deployments(cluster, namespace)), (
        "Hold keeps the new revision"
    )
    done = cli(cluster, namespace, "status", "stall", "--timeout", "20")
    assert done.returncode == 1 and "ProgressDeadlineExceeded" in done.stdout


def test_pause_freezes_a_rollout_and_resume_finishes_it(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    b = ready_after(
        pdd("pause").mtp(3, modules=3).prefill(replicas=2).decode(replicas=2), 1500
    ).rollout(maxSurge=1, maxUnavailable=0, drainSeconds=1)
    create_pdd(cluster.api_client, namespace, b.dict())
    wait_settled(cluster.api_client, namespace, "pause")
    b.mtp(2, modules=3)
    new = compat_revision(b.build().spec)
    patch_spec(cluster.api_client, namespace, "pause", b.dict()["spec"])
    wait_for(lambda: f"pause-{new}-prefill" in deployments(cluster, namespace), "roll started", 30)
    assert cli(cluster, namespace, "pause", "pause").returncode == 0
    paused = progressing(cluster, namespace, "pause", "Paused", 20)
    assert paused["status"] == "Unknown"
    frozen = {n: d.spec.replicas for n, d in deployments(cluster, namespace).items()}
    time.sleep(6)
    assert {n: d.spec.replicas for n, d in deployments(cluster, namespace).items()} == frozen
    assert cli(cluster, namespace, "resume", "pause").returncode == 0
    done = cli(cluster, namespace, "status", "pause", "--timeout", "120", timeout=150)
    assert done.returncode == 0, done.stdout
    assert get_pdd(cluster.api_client, namespace, "pause")["status"]["currentRevision"] == new


def test_a_canary_holds_at_its_share_until_promoted(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    b = ready_after(pdd("canary").mtp(3, modules=3).prefill(replicas=2).decode(replicas=2), 700)
    b.rollout(maxSurge=1, maxUnavailable=0, drainSeconds=1, canary={"percent": 50})
    create_pdd(cluster.api_client, namespace, b.dict())
    old = wait_settled(cluster.api_client, namespace, "canary")["status"]["currentRevision"]
    watcher = watch(cluster, namespace, "canary", b)
    b.mtp(2, modules=3)
    new = compat_revision(b.build().spec)
    watcher.expect(b.build().spec)
    patch_spec(cluster.api_client, namespace, "canary", b.dict()["spec"])
    held = progressing(cluster, namespace, "canary", "CanaryHold", 90)
    obj = get_pdd(cluster.api_client, namespace, "canary")
    table = {r["revision"]: r for r in obj["status"]["revisions"]}
    assert table[old]["phase"] == table[new]["phase"] == "Serving", table
    assert (table[new]["prefill"], table[new]["decode"]) == ("1/1", "1/1")
    assert (table[old]["prefill"], table[old]["decode"]) == ("1/1", "1/1")
    assert obj["status"]["rollout"]["canaryTrafficPercent"] == 50
    assert held["status"] == "Unknown" and "50%" in held["message"]
    time.sleep(4)  # held means held
    assert progressing(cluster, namespace, "canary", "CanaryHold", 1)
    # docs/guide.md's `pdmtp rollout status demo --timeout 60` during the hold says why it waits.
    waiting = cli(cluster, namespace, "status", "canary", "--timeout", "2")
    assert waiting.returncode == 1, waiting.stdout + waiting.stderr
    first_line = waiting.stdout.splitlines()[0]
    assert first_line == f"Waiting for rollout of canary to finish: CanaryHold: {held['message']}"
    assert f"canary: revision {new}" in first_line and "50%" in first_line, first_line
    operator.restart()  # killed during the hold: it holds again from what it observes
    assert progressing(cluster, namespace, "canary", "CanaryHold", 30)
    done = cli(cluster, namespace, "promote", "canary")
    assert done.returncode == 0 and new in done.stdout, done.stderr
    # The event is posted after the status write that releases the hold: an operator killed
    # between the two never posts it (its successor finds no hold to release), so the kill
    # waits for it.
    wait_for(
        lambda: any(e.reason == "Promoted" for e in events(cluster, namespace, "canary")),
        "the Promoted event",
        30,
    )
    operator.restart()  # and killed again as the promoted roll moves on
    assert (
        cli(cluster, namespace, "status", "canary", "--timeout", "120", timeout=150).returncode == 0
    )
    watcher.stop()
    assert watcher.violations == [], (watcher.violations[:5], watcher.views)
    # The hold's share leaves the record with the hold (the status write clears nested fields).
    record = get_pdd(cluster.api_client, namespace, "canary")["status"]["rollout"]
    assert record["phase"] == "Complete" and "canaryTrafficPercent" not in record, record


def test_a_scale_down_takes_pods_out_of_routing_before_it_removes_them(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    """Serving, no rollout: 2P/3D -> 1P/1D -> 2P/2D. Every removed engine pod was first marked
    leaving and dropped from its router's args (invariant 8 over every watch event)."""
    b = pdd("shrink").mtp(3, modules=3).prefill(replicas=2).decode(replicas=3)
    b.rollout(maxSurge=1, maxUnavailable=0, drainSeconds=1)
    create_pdd(cluster.api_client, namespace, b.dict())
    rev = wait_settled(cluster.api_client, namespace, "shrink")["status"]["currentRevision"]
    watcher = watch(cluster, namespace, "shrink", b)
    for prefill, decode in ((1, 1), (2, 2)):
        b.prefill(replicas=prefill).decode(replicas=decode)
        watcher.expect(b.build().spec)
        patch_spec(cluster.api_client, namespace, "shrink", b.dict()["spec"])
        obj = wait_settled(cluster.api_client, namespace, "shrink", 120)
        assert (obj["status"]["prefill"], obj["status"]["decode"]) == (
            f"{prefill}/{prefill}",
            f"{decode}/{decode}",
        )
    watcher.stop()
    assert watcher.violations == [], (watcher.violations[:5], watcher.views)
    assert obj["status"]["currentRevision"] == rev, "scaling is no rollout"
    pods = client.CoreV1Api(cluster.api_client).list_namespaced_pod(namespace).items
    assert not [
        p.metadata.name for p in pods if v.ANNOTATION_LEAVING in (p.metadata.annotations or {})
    ]
    leaving = [
        e
        for e in client.CoreV1Api(cluster.api_client).list_namespaced_event(namespace).items
        if e.reason == "PodLeaving"
    ]
    assert len(leaving) == 3, [e.message for e in leaving]


def back_at(cluster: Cluster, namespace: str, revision: str) -> Any:
    """The `undo` PDDeployment once it has settled at `revision`."""
    return wait_for(
        lambda: (
            (o := get_pdd(cluster.api_client, namespace, "undo"))
            and settled(o)
            and o["status"]["currentRevision"] == revision
            and o
        ),
        f"back at revision {revision}",
        90,
    )


def test_undo_returns_to_a_recorded_revision(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    b = pdd("undo").mtp(3, modules=3).rollout(maxSurge=1, maxUnavailable=0, drainSeconds=1)
    create_pdd(cluster.api_client, namespace, b.dict())
    first = wait_settled(cluster.api_client, namespace, "undo")["status"]["currentRevision"]
    b.mtp(2, modules=3)
    patch_spec(cluster.api_client, namespace, "undo", b.dict()["spec"])
    second = compat_revision(b.build().spec)
    wait_for(
        lambda: (
            (o := get_pdd(cluster.api_client, namespace, "undo"))
            and settled(o)
            and o["status"]["currentRevision"] == second
        ),
        "second settled",
        90,
    )
    history = cli(cluster, namespace, "history", "undo")
    assert history.returncode == 0 and first in history.stdout and second in history.stdout, (
        history.stdout
    )
    # The same through kubectl, which runs the kubectl-pdmtp plugin it finds on PATH.
    kubectl = cluster.local.bin_dir / "kubectl" if cluster.local else Path("kubectl")
    plugin = subprocess.run(
        [str(kubectl), "pdmtp", "rollout", "history", "undo", "-n", namespace],
        env={
            **os.environ,
            "PATH": f"{PDMTP.parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "KUBECONFIG": str(cluster.kubeconfig),
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert plugin.returncode == 0 and plugin.stdout == history.stdout, plugin.stderr
    done = cli(cluster, namespace, "undo", "undo", "--to-revision", "1")
    assert done.returncode == 0 and first in done.stdout, done.stderr
    assert back_at(cluster, namespace, first)["spec"]["speculative"]["numSpeculativeTokens"] == 3
    # Without --to-revision: back to the previous one (docs/guide.md's `pdmtp rollout undo demo`).
    done = cli(cluster, namespace, "undo", "undo")
    assert done.returncode == 0 and second in done.stdout, done.stdout + done.stderr
    assert back_at(cluster, namespace, second)["spec"]["speculative"]["numSpeculativeTokens"] == 2
    bad = cli(cluster, namespace, "undo", "undo", "--to-revision", "99")
    assert bad.returncode == 1 and "no revision 99" in bad.stderr


def test_scaling_mid_roll_applies_at_once_and_keeps_the_invariants(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    b = ready_after(
        pdd("scale").mtp(3, modules=3).prefill(replicas=2).decode(replicas=2), 1500
    ).rollout(maxSurge=1, maxUnavailable=0, drainSeconds=1)
    create_pdd(cluster.api_client, namespace, b.dict())
    wait_settled(cluster.api_client, namespace, "scale")
    watcher = watch(cluster, namespace, "scale", b)
    b.mtp(2, modules=3)
    new = compat_revision(b.build().spec)
    watcher.expect(b.build().spec)
    patch_spec(cluster.api_client, namespace, "scale", b.dict()["spec"])
    wait_for(lambda: f"scale-{new}-prefill" in deployments(cluster, namespace), "roll started", 30)
    b.prefill(replicas=3).decode(replicas=1)
    watcher.expect(b.build().spec)
    patch_spec(cluster.api_client, namespace, "scale", b.dict()["spec"])
    operator.restart()  # killed as the scale lands mid-roll
    obj = wait_settled(cluster.api_client, namespace, "scale", 150)
    watcher.stop()
    assert watcher.violations == [], (watcher.violations[:5], watcher.views)
    assert obj["status"]["currentRevision"] == new, "the roll restarted on another revision"
    assert (obj["status"]["prefill"], obj["status"]["decode"]) == ("3/3", "1/1")


def _free_gpus(cluster: Cluster) -> int:
    core = client.CoreV1Api(cluster.api_client)
    nodes = [n for n in core.list_node().items if n.metadata.name.startswith("pdmtp-gpu-")]
    total = sum(int(n.status.allocatable.get(v.GPU_RESOURCE, 0)) for n in nodes)
    used = 0
    for p in core.list_pod_for_all_namespaces().items:
        if p.spec.node_name in {n.metadata.name for n in nodes} and p.status.phase not in (
            "Succeeded",
            "Failed",
        ):
            for c in p.spec.containers:
                used += int(((c.resources and c.resources.requests) or {}).get(v.GPU_RESOURCE, 0))
    return total - used


def test_a_full_cluster_rolls_pair_by_pair_and_says_what_would_work(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    if cluster.local is None:
        pytest.skip("needs the local cluster's known fake GPU capacity")
    wait_for(lambda: _free_gpus(cluster) == 32, "every fake GPU free", 120, interval=1)
    # 2 prefill + 2 decode at 8 GPUs each: every GPU of the 4 fake nodes taken.
    b = ready_after(
        pdd("full").mtp(3, modules=3).prefill(replicas=2, tp=8).decode(replicas=2, tp=8), 300
    )
    b.rollout(maxSurge=0, maxUnavailable=1, drainSeconds=1)
    create_pdd(cluster.api_client, namespace, b.dict())
    wait_settled(cluster.api_client, namespace, "full")
    assert _free_gpus(cluster) == 0
    watcher = watch(cluster, namespace, "full", b)
    b.mtp(2, modules=3)
    watcher.expect(b.build().spec)
    patch_spec(cluster.api_client, namespace, "full", b.dict()["spec"])
    obj = wait_settled(cluster.api_client, namespace, "full", 180)
    watcher.stop()
    assert watcher.violations == [], (watcher.violations[:5], watcher.views)
    assert obj["status"]["currentRevision"] == compat_revision(b.build().spec)

    # maxSurge 1 on the same full cluster: the surge pod cannot be placed; the status says so.
    b.mtp(3, modules=3).rollout(
        maxSurge=1, maxUnavailable=0, drainSeconds=1, progressDeadlineSeconds=10, onFailure="Hold"
    )
    patch_spec(cluster.api_client, namespace, "full", b.dict()["spec"])
    stuck = progressing(cluster, namespace, "full", "ProgressDeadlineExceeded", 60)
    assert "maxSurge: 0 with maxUnavailable: 1" in stuck["message"], stuck["message"]


def test_one_replica_roles_never_stall(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    for policy in ({"maxSurge": 1, "maxUnavailable": 0}, {"maxSurge": 0, "maxUnavailable": 1}):
        name = "one" if policy["maxSurge"] else "one-nosurge"
        b = ready_after(pdd(name).mtp(3, modules=3), 300).rollout(drainSeconds=1, **policy)
        create_pdd(cluster.api_client, namespace, b.dict())
        wait_settled(cluster.api_client, namespace, name)
        b.mtp(2, modules=3)
        patch_spec(cluster.api_client, namespace, name, b.dict()["spec"])
        obj = wait_settled(cluster.api_client, namespace, name, 90)
        assert obj["status"]["currentRevision"] == compat_revision(b.build().spec)

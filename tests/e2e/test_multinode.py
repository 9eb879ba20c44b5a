"""kind e2e: a multi-node decode role on real nodes. Each decode replica is a group of two pods on
two workers, gang-scheduled by the kube-scheduler through the Workload API; the emulated ranks
really meet over the pod network (the worker dials the leader's rendezvous port through the
group's headless Service), and the leader answers only once every rank has joined and dies when
one goes away, as a vLLM engine does. A single-node prefill feeds it; the real router lists
leaders only; the in-cluster load client counts every request.

In order (the tests build on each other, in one namespace):
1. one decode group serving: both pods bound at once to two workers, the PodGroup scheduled, the
   worker joined from its own pod's address;
2. scale 1 -> 2 decode groups under load: 0 failed;
3. a paired MTP rollout of the 2 groups under load: 0 failed, 0 cross-revision, every group
   placed whole at every watch event, and the rollout invariants checked at every watch event
   (the core's checker, fed by the cluster tier's watcher): the groups that Ready router pods
   list, read from those pods' own args, never fewer than the floor (issue 40);
4. a worker pod deleted (gracefully) under load: its group leaves the router while its leader
   still answers, is replaced whole, and serves again: 0 failed;
5. a worker pod killed (no grace: a crash cannot be drained): the failed requests and the
   seconds to recovery are reported, and 0 fail after recovery;
6. scale 2 -> 1 decode groups under load: 0 failed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from builders import pdd
from cluster.gangwatch import SCHEDULED_CONDITION, GangWatch
from cluster.operator_harness import RolloutWatcher
from e2e.kindkit import Figures, Kind, LoadRun, patch_pdd, serving, wait_for
from kubernetes import config as kube_config
from pdmtp.api.v1alpha1 import PDDeployment
from pdmtp.api.vocabulary import (
    LABEL_GROUP,
    LABEL_GROUP_RANK,
    LABEL_NAME,
    LABEL_REVISION,
    LABEL_ROLE,
)
from pdmtp.core.agreement import check
from pdmtp.core.rollout.steering import target_and_policy

NAME = "wide"
record = Figures("PDMTP_E2E_MULTINODE_RESULT").record
GROUP_NODES = 2
PLACEMENT_SECONDS = 2.0
state: dict[str, Any] = {}


def spec_for(kind: Kind, k: int, decode_groups: int) -> dict[str, Any]:
    return (
        pdd(NAME)
        .set(image=kind.images.emulator, model={"name": kind.images.engine_model})
        .mtp(k, modules=3, method="deepseek_mtp")
        .prefill(replicas=1)
        .decode(
            replicas=decode_groups,
            multiNode={"nodes": GROUP_NODES, "layout": "DataParallel", "dataParallelSize": 2},
        )
        .router(image=kind.images.router, resources={"requests": {"cpu": "100m"}})
        .rollout(maxSurge=1, maxUnavailable=0, drainSeconds=3)
        # A 15 s preStop (grace less the engine's 30 s shutdown): the window in which a group
        # whose worker is being deleted leaves the router while its leader still answers.
        .set(pod={"terminationGracePeriodSeconds": 45})
        .unjudged()  # the floor in whole groups is the question, not the verdict's hold
        .dict()
    )


@pytest.fixture(scope="module")
def api(kind: Kind) -> Iterator[Any]:
    """A Kubernetes API client of the kind cluster (the gang watch reads raw pod JSON)."""
    client = kube_config.new_client_from_config(config_file=str(kind.kubeconfig))  # type: ignore[no-untyped-call]
    yield client
    client.close()


def engine_pods(kind: Kind, namespace: str, role: str) -> list[dict[str, Any]]:
    return kind.pods(namespace, f"{LABEL_NAME}={NAME},{LABEL_ROLE}={role}")


def groups_of(pods: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Pods by (revision/group id), each list in rank order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        labels = pod["metadata"]["labels"]
        out.setdefault(f"{labels[LABEL_REVISION]}/{labels[LABEL_GROUP]}", []).append(pod)
    for members in out.values():
        members.sort(key=lambda p: int(p["metadata"]["labels"][LABEL_GROUP_RANK]))
    return out


def settled_at(kind: Kind, namespace: str, decode_groups: int) -> bool:
    """One prefill pod and exactly `decode_groups` whole groups, every pod Ready (a worker has no
    probe: Ready once running), none leaving; Available and not progressing."""
    prefill = engine_pods(kind, namespace, "prefill")
    if len(prefill) != 1 or not serving(prefill[0]):
        return False
    groups = groups_of(engine_pods(kind, namespace, "decode"))
    if len(groups) != decode_groups:
        return False
    for members in groups.values():
        if len(members) != GROUP_NODES or not all(serving(p) for p in members):
            return False
    return kind.settled(namespace, NAME)


def wait_settled(kind: Kind, namespace: str, decode_groups: int, timeout: float = 240) -> None:
    wait_for(
        lambda: settled_at(kind, namespace, decode_groups),
        f"1 prefill + {decode_groups} decode group(s) serving",
        timeout,
    )


def patch(kind: Kind, namespace: str, body: dict[str, Any]) -> None:
    patch_pdd(kind, namespace, NAME, body)


def log_events(kind: Kind, namespace: str, pod: str) -> list[dict[str, Any]]:
    """The emulator's JSON log lines of `pod`."""
    out = kind.kubectl("-n", namespace, "logs", pod, check=False)
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def assert_placed_whole(kind: Kind, namespace: str) -> dict[str, list[str]]:
    """Every decode group's pods bound to distinct workers, its PodGroup scheduled, and its leader
    joined by each worker from that worker's pod address. Returns the nodes per group."""
    nodes: dict[str, list[str]] = {}
    for key, members in groups_of(engine_pods(kind, namespace, "decode")).items():
        placed = [p["spec"].get("nodeName") for p in members]
        assert all(placed) and len(set(placed)) == GROUP_NODES, (key, placed)
        nodes[key] = placed
        group_name = members[0]["spec"]["schedulingGroup"]["podGroupName"]
        pod_group = kind.get("podgroups.scheduling.k8s.io", "-n", namespace, group_name)
        # The scheduler's own word that it placed the gang (the condition's name is per version).
        version = pod_group["apiVersion"].rpartition("/")[2]
        conds = {c["type"]: c for c in pod_group.get("status", {}).get("conditions", [])}
        scheduled = conds.get(SCHEDULED_CONDITION[version], {})
        assert (scheduled.get("status"), scheduled.get("reason")) == ("True", "Scheduled"), (
            pod_group.get("status")
        )
        leader, workers = members[0], members[1:]
        joined = {
            e.get("peer", "").rsplit(":", 1)[0]
            for e in log_events(kind, namespace, leader["metadata"]["name"])
            if e.get("msg") == "rank joined"
        }
        for worker in workers:
            assert worker["status"]["podIP"] in joined, (key, worker["status"]["podIP"], joined)
    return nodes


def test_1_a_group_on_two_nodes_is_placed_whole(kind: Kind, namespace: str) -> None:
    started = time.monotonic()
    kind.apply(spec_for(kind, 3, 1), namespace)
    wait_settled(kind, namespace, 1)
    nodes = assert_placed_whole(kind, namespace)
    record(
        "a 2-node decode group created",
        {"seconds_to_serving": round(time.monotonic() - started, 1), "nodes": nodes},
    )
    # The scheduler reports the gang: both members bound by the one placement it allowed.
    events = kind.get("events", "-n", namespace, "--field-selector", "reason=Scheduled")["items"]
    scheduled = {e["involvedObject"]["name"] for e in events}
    members = next(iter(groups_of(engine_pods(kind, namespace, "decode")).values()))
    assert {p["metadata"]["name"] for p in members} <= scheduled, scheduled


def test_2_scale_out_by_a_group_under_load(kind: Kind, namespace: str) -> None:
    scale_under_load(kind, namespace, 2, "scale 1 -> 2 decode groups under load")


def test_3_two_groups_roll_paired_under_load_keeping_the_floor_clients_reach(
    kind: Kind, namespace: str, api: Any
) -> None:
    """Issue 40's deployment: 2 decode groups of 2 pods, maxUnavailable 0, a paired roll (k 3 ->
    2). Before the fix, on the local control plane, the Ready router pods listed 1 of the 2
    groups for about a second while the old revision's router went."""
    revision = kind.pdd(namespace, NAME)["status"]["currentRevision"]
    before = assert_placed_whole(kind, namespace)
    old_spec = PDDeployment.model_validate(spec_for(kind, 3, 2)).spec
    new_spec = PDDeployment.model_validate(spec_for(kind, 2, 2)).spec
    watcher = RolloutWatcher(api, namespace, NAME, target_and_policy(check(old_spec))[1])
    watcher.start(old_spec)
    selector = f"{LABEL_NAME}={NAME},{LABEL_ROLE}=decode"
    try:
        with GangWatch(api, namespace, selector, podgroup_version=None) as gangs:
            run = LoadRun.start(kind, namespace, NAME, max_requests=20_000, max_seconds=300)
            run.wait_sending()
            rolled = time.monotonic()
            watcher.expect(new_spec)
            patch(kind, namespace, {"spec": {"speculative": {"numSpeculativeTokens": 2}}})
            wait_for(
                lambda: (
                    kind.pdd(namespace, NAME)["status"].get("currentRevision") != revision
                    and settled_at(kind, namespace, 2)
                ),
                "the paired rollout to a new revision",
                300,
            )
            roll_seconds = round(time.monotonic() - rolled, 1)
            run.wait_answers()  # on the new revision alone
            run.stop()
            summary = run.summary()
            bound = placements(gangs)
    finally:
        watcher.stop()
    new_revision = kind.pdd(namespace, NAME)["status"]["currentRevision"]
    after = assert_placed_whole(kind, namespace)
    state["revision"] = new_revision
    record(
        "paired MTP rollout of 2 decode groups of 2 pods under load",
        {
            "rollout_seconds": roll_seconds,
            "requests_sent": summary["sent"],
            "requests_failed": summary["failed"],
            "cross_revision": summary["cross_revision"],
            "pairs": summary["pairs"],
            "fewest_groups_listed_by_ready_routers": watcher.monitor.lowest_reach,
            "watch_events_checked": watcher.events_seen,
            "invariant_violations": len(watcher.violations),
            "nodes_before": before,
            "nodes_after": after,
            "seconds_between_a_groups_bindings": bound,
        },
    )
    # The floor as clients reach it (maxUnavailable 0: both groups, the prefill) at every event.
    assert watcher.violations == [], (watcher.violations[:5], watcher.views)
    assert watcher.monitor.lowest_reach == {"prefill": 1, "decode": 2}, watcher.monitor.lowest_reach
    # Every group the watch saw placed was placed whole: both members bound by one placement (a
    # gang binds its members with one API call each, a moment apart).
    assert len(bound) >= 4 and all(s <= PLACEMENT_SECONDS for s in bound.values()), (
        bound,
        gangs.report(),
    )
    assert summary["failed"] == 0, summary
    assert summary["cross_revision"] == 0, summary
    pairs = summary["pairs"]
    assert f"{new_revision}<-{new_revision} k=2<-2" in pairs, pairs
    assert f"{revision}<-{revision} k=3<-3" in pairs, pairs


def placements(gangs: GangWatch) -> dict[str, float]:
    """Per group the watch saw bound: seconds between its members' first bound sightings (inf when
    a member was never seen bound). Group pods are named `<group>-<rank>`; the pods bound before
    the watch started are all seen bound at its first list."""
    bound = dict(gangs.bound_at)
    out: dict[str, float] = {}
    for group in sorted({pod.rsplit("-", 1)[0] for pod in bound}):
        times = [bound.get(f"{group}-{rank}") for rank in range(GROUP_NODES)]
        known = [t for t in times if t is not None]
        out[group] = max(known) - min(known) if len(known) == GROUP_NODES else float("inf")
    return out


def scale_under_load(kind: Kind, namespace: str, groups: int, key: str) -> None:
    run = LoadRun.start(kind, namespace, NAME, max_requests=20_000, max_seconds=300)
    run.wait_sending()
    started = time.monotonic()
    patch(kind, namespace, {"spec": {"decode": {"replicas": groups}}})
    wait_settled(kind, namespace, groups)
    seconds = round(time.monotonic() - started, 1)
    run.wait_answers()  # at the new size
    run.stop()
    summary = run.summary()
    nodes = assert_placed_whole(kind, namespace)
    record(
        key,
        {
            "seconds": seconds,
            "requests_sent": summary["sent"],
            "requests_failed": summary["failed"],
            "cross_revision": summary["cross_revision"],
            "nodes": nodes,
        },
    )
    assert (summary["failed"], summary["cross_revision"]) == (0, 0), summary


def worker_of_a_group(kind: Kind, namespace: str) -> tuple[str, str]:
    """(group key, the name of its rank-1 pod) of the first decode group."""
    groups = groups_of(engine_pods(kind, namespace, "decode"))
    key = sorted(groups)[0]
    return key, groups[key][1]["metadata"]["name"]


def lose_a_worker(kind: Kind, namespace: str, *, crash: bool) -> dict[str, Any]:
    """Delete one group's worker under load; the group is replaced whole. Returns the figures."""
    key, worker = worker_of_a_group(kind, namespace)
    run = LoadRun.start(kind, namespace, NAME, max_requests=20_000, max_seconds=300)
    run.wait_sending()
    before = run.progress() or {}
    started = time.monotonic()
    grace = ["--grace-period=0", "--force"] if crash else []
    kind.kubectl("-n", namespace, "delete", "pod", worker, "--wait=false", *grace)

    def replaced() -> bool:
        return key not in groups_of(engine_pods(kind, namespace, "decode")) and settled_at(
            kind, namespace, 2
        )

    wait_for(replaced, f"group {key} replaced whole and serving", 240, every=0.5)
    recovery = round(time.monotonic() - started, 1)
    during = run.progress() or {}
    # Serving again: what is sent from here on must all succeed.
    run.wait_answers()
    run.stop()
    summary = run.summary()
    after = LoadRun.start(kind, namespace, NAME, max_requests=200, max_seconds=120).summary()
    return {
        "group": key,
        "worker": worker,
        "seconds_to_recovery": recovery,
        "requests_sent": summary["sent"],
        "requests_failed": summary["failed"],
        "failed_before_delete": before.get("failed", 0),
        "failed_by_recovery": during.get("failed", 0),
        "errors": sorted(set(summary.get("errors") or [])),
        "cross_revision": summary["cross_revision"],
        "after_recovery": {"sent": after["sent"], "failed": after["failed"]},
    }


def test_4_a_deleted_worker_leaves_the_router_first_and_its_group_is_replaced(
    kind: Kind, namespace: str
) -> None:
    figures = lose_a_worker(kind, namespace, crash=False)
    record("worker pod deleted (graceful) under load, 2 decode groups", figures)
    assert figures["requests_failed"] == 0, figures
    assert figures["cross_revision"] == 0, figures
    assert figures["after_recovery"]["failed"] == 0, figures


def test_5_a_crashed_worker_is_counted_and_its_group_recovers(kind: Kind, namespace: str) -> None:
    figures = lose_a_worker(kind, namespace, crash=True)
    record("worker pod killed (no grace) under load, 2 decode groups", figures)
    # A crash cannot be drained: what failed is reported, not asserted away; what follows
    # recovery must all succeed, and nothing may cross revisions.
    assert figures["cross_revision"] == 0, figures
    assert figures["after_recovery"]["failed"] == 0, figures
    assert figures["requests_failed"] == figures["failed_by_recovery"], figures


def test_6_scale_in_by_a_group_under_load(kind: Kind, namespace: str) -> None:
    scale_under_load(kind, namespace, 1, "scale 2 -> 1 decode groups under load")

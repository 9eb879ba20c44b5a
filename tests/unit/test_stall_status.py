"""A stall says what it waits for (issue 31, item 6): the Progressing condition and
status.waitingFor name the pods and objects an unfinished roll, canary hold or scale waits for,
in every revision and role, and a Stalled Warning is posted when a stuck one first appears, not at
every reconcile.

Driven through `decide` on the in-memory cluster (FakeCluster), as the shell would run it.
"""

from __future__ import annotations

from typing import Any

from builders import PDDBuilder, pdd
from fake_cluster import FakeCluster
from pdmtp.api import reasons
from pdmtp.api import vocabulary as v
from pdmtp.core.actions import Event
from pdmtp.core.reconcile import Decision
from test_status_golden import NOW, respec, serving

CPU = (
    "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: 1 No "
    "preemption victims found for incoming pod."
)
GPU = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."


def canary(k: int = 3, routers: int = 1) -> PDDBuilder:
    return (
        pdd("x")
        .mtp(k, modules=3)
        .prefill(replicas=2)
        .decode(replicas=2)
        .router(replicas=routers)
        .rollout(canary={"percent": 50})
    )


def progressing(d: Decision) -> dict[str, Any]:
    return next(c for c in d.status["conditions"] if c["type"] == reasons.PROGRESSING)


def stalls(d: Decision) -> list[Event]:
    return [e for e in d.events if e.reason == reasons.STALLED]


def unplaceable(pod: dict[str, Any], message: str = CPU) -> None:
    """The scheduler cannot place the pod (it stays so: run_pods keeps a pod of its template)."""
    pod["status"] = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastTransitionTime": "2027-01-15T08:00:11Z",
            }
        ],
    }


def rolled_to_the_new_router(routers: int = 1) -> tuple[FakeCluster, str]:
    """A 2P/2D canary of 50% under way: the new revision's router Deployment exists."""
    fc = serving(canary(routers=routers))
    respec(fc, canary(k=2, routers=routers), 2)
    new = fc.reconcile(NOW + 10).status["updateRevision"]
    fc.run_pods()
    fc.reconcile(NOW + 11)
    fc.run_pods()
    return fc, new


def test_a_canary_whose_new_router_cannot_be_placed_names_it_and_why() -> None:
    # The run: a 2-core kind node, the canary's router Pending on Insufficient cpu.
    fc, new = rolled_to_the_new_router()
    router = fc.pods[f"x-{new}-router-0"]
    unplaceable(router)
    d = fc.reconcile(NOW + 12)
    cond = progressing(d)
    assert cond["status"] == "True" and cond["reason"] == reasons.PODS_UNSCHEDULABLE
    assert (
        f"Pod/x-{new}-router-0 (Unschedulable: 0/1 nodes are available: 1 Insufficient cpu."
        in (cond["message"])
    )
    assert cond["message"].startswith(f"rolling from 8c70ee5b to {new}: the scheduler cannot")
    first = d.status["waitingFor"][0]
    assert first == {
        "object": f"Pod/x-{new}-router-0",
        "revision": new,
        "role": "router",
        "reason": "Unschedulable",
        "message": CPU,
        "stuck": True,
    }
    (event,) = stalls(d)
    assert event.type == "Warning"
    assert event.message.startswith(f"Waiting for Pod/x-{new}-router-0 (Unschedulable: ")
    assert "Insufficient cpu" in event.message

    # The same stall at the next reconciles: named again, posted no more.
    for t in (13, 14, 15):
        fc.run_pods()
        again = fc.reconcile(NOW + t)
        assert f"Pod/x-{new}-router-0" in progressing(again)["message"]
        assert stalls(again) == []


def held(routers: int = 2) -> tuple[FakeCluster, str]:
    fc, new = rolled_to_the_new_router(routers)
    for t in range(12, 20):
        d = fc.reconcile(NOW + t)
        fc.run_pods()
        if progressing(d)["reason"] == reasons.CANARY_HOLD:
            return fc, new
    raise AssertionError("the canary never held")


def test_a_canary_hold_names_a_router_pod_that_cannot_be_placed() -> None:
    fc, new = held(routers=2)
    quiet = fc.reconcile(NOW + 30)
    assert "waiting for" not in progressing(quiet)["message"] and stalls(quiet) == []
    assert "waitingFor" not in quiet.status
    unplaceable(fc.pods[f"x-{new}-router-1"])
    d = fc.reconcile(NOW + 31)
    cond = progressing(d)
    assert (cond["status"], cond["reason"]) == ("Unknown", reasons.CANARY_HOLD)
    assert cond["message"].startswith(f"canary: revision {new} serves next to 8c70ee5b")
    assert cond["message"].endswith(
        f"; promote it with `pdmtp rollout promote`; waiting for Pod/x-{new}-router-1 "
        f"(Unschedulable: {CPU})"
    )
    assert [e.message for e in stalls(d)] == [
        f"Waiting for Pod/x-{new}-router-1 (Unschedulable: {CPU})"
    ]


def test_a_canary_hold_names_the_anchor_revisions_pods_too() -> None:
    fc, _ = held(routers=1)
    (anchor,) = fc.pods_of("8c70ee5b-decode")
    anchor["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    anchor["status"]["containerStatuses"] = [
        {
            "name": "engine",
            "ready": False,
            "restartCount": 3,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
        }
    ]
    d = fc.reconcile(NOW + 30)
    name = anchor["metadata"]["name"]
    assert progressing(d)["reason"] == reasons.CANARY_HOLD
    assert (
        f"waiting for Pod/{name} (CrashLoop: container engine: 3 restart(s), last: OOMKilled)"
        in progressing(d)["message"]
    )
    assert [e.message for e in stalls(d)] == [
        f"Waiting for Pod/{name} (CrashLoop: container engine: 3 restart(s), last: OOMKilled)"
    ]


def test_a_scale_names_the_pods_it_waits_for() -> None:
    b = pdd("x").mtp(3, modules=3)
    fc = serving(b)
    respec(fc, pdd("x").mtp(3, modules=3).prefill(replicas=3), 2)
    fc.reconcile(NOW + 10)
    fc.run_pods(ready=False)
    rev = fc.body["status"]["currentRevision"]
    new = sorted(
        p["metadata"]["name"]
        for p in fc.pods_of(f"{rev}-prefill")
        if p["metadata"]["name"] != f"x-{rev}-prefill-0"
    )
    for name in new:
        unplaceable(fc.pods[name], GPU)
    d = fc.reconcile(NOW + 11)
    cond = progressing(d)
    assert cond["reason"] == reasons.PODS_UNSCHEDULABLE
    assert cond["message"] == (
        f"scaling {rev}: the scheduler cannot place 2 of its pod(s); add capacity or allow "
        f"spec.rollout.maxUnavailable so old pods make room; waiting for Pod/{new[0]} "
        f"(Unschedulable: {GPU}), Pod/{new[1]} (Unschedulable: {GPU})"
    )


def test_the_removal_gate_names_the_pods_routers_still_list_and_posts_no_warning() -> None:
    b = pdd("x").mtp(3, modules=3).decode(replicas=2)
    fc = serving(b)
    respec(fc, pdd("x").mtp(3, modules=3).decode(replicas=1), 2)
    fc.reconcile(NOW + 10)  # marks the victim leaving; its router still lists it
    d = fc.reconcile(NOW + 11)
    rev = fc.body["status"]["currentRevision"]
    (victim,) = [
        p["metadata"]["name"]
        for p in fc.pods_of(f"{rev}-decode")
        if v.ANNOTATION_LEAVING in p["metadata"].get("annotations", {})
    ]
    listed = [w for w in d.status["waitingFor"] if w["reason"] == "ListedByRouter"]
    assert [(w["object"], w["stuck"]) for w in listed] == [(f"Pod/{victim}", False)]
    assert (
        f"waiting for Pod/{victim} (ListedByRouter: leaving; 1 router pod(s) of {rev} "
        "still list it)" in progressing(d)["message"]
    )
    assert stalls(d) == []  # on its way: the router rolls by itself


def test_a_budget_that_holds_a_drain_over_a_stuck_role_is_named_and_posted() -> None:
    fc = serving(pdd("x").mtp(3, modules=3).decode(replicas=2))
    rev = fc.body["status"]["currentRevision"]
    # A drain evicted decode-1; its replacement cannot be placed (the node is cordoned and no
    # other has a GPU free), so the budget allows no eviction of the Ready decode-0.
    unplaceable(fc.pods[f"x-{rev}-decode-1"], GPU)
    fc.pods[f"x-{rev}-decode-0"]["spec"]["nodeName"] = "draining"
    fc.cordoned = frozenset({"draining"})
    fc.objects[f"{v.DISRUPTION_BUDGET_KIND}/x-{rev}-decode"]["status"] = {
        "disruptionsAllowed": 0,
        "currentHealthy": 1,
        "desiredHealthy": 1,
        "expectedPods": 2,
    }
    d = fc.reconcile(NOW + 10)
    facts = [(w["object"], w["reason"], w["stuck"]) for w in d.status["waitingFor"]]
    assert facts == [
        (f"Pod/x-{rev}-decode-1", "Unschedulable", True),
        (f"PodDisruptionBudget/x-{rev}-decode", "DisruptionBudget", True),
    ]
    assert (
        f"PodDisruptionBudget/x-{rev}-decode (DisruptionBudget: allows no eviction: 1 healthy "
        "of 2, 1 needed; a node drain cannot evict its 1 Ready pod(s) until more are Ready)"
    ) in progressing(d)["message"]
    (event,) = stalls(d)
    assert f"Pod/x-{rev}-decode-1" in event.message
    assert f"PodDisruptionBudget/x-{rev}-decode" in event.message


def test_a_stall_is_posted_when_it_appears_and_again_only_after_it_cleared() -> None:
    fc, new = held(routers=2)
    pod = f"x-{new}-router-1"
    unplaceable(fc.pods[pod])
    assert len(stalls(fc.reconcile(NOW + 30))) == 1
    assert stalls(fc.reconcile(NOW + 31)) == []
    # A second stuck pod: only it is news.
    decode = fc.pods_of(f"{new}-decode")[0]
    unplaceable(decode, GPU)
    (event,) = stalls(fc.reconcile(NOW + 32))
    assert event.message == f"Waiting for Pod/{decode['metadata']['name']} (Unschedulable: {GPU})"
    # Cleared, then back: news again.
    fc.pods[pod]["status"] = {
        "phase": "Running",
        "podIP": "192.0.2.200",
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    assert stalls(fc.reconcile(NOW + 33)) == []
    unplaceable(fc.pods[pod])
    (event,) = stalls(fc.reconcile(NOW + 34))
    assert event.message.startswith(f"Waiting for Pod/{pod} (Unschedulable")


def test_many_waits_are_bounded_in_the_condition_and_the_status() -> None:
    b = pdd("x").mtp(3, modules=3)
    fc = serving(b)
    respec(fc, pdd("x").mtp(3, modules=3).prefill(replicas=8).decode(replicas=8), 2)
    fc.reconcile(NOW + 10)
    fc.run_pods(ready=False)
    rev = fc.body["status"]["currentRevision"]
    for p in fc.pods.values():
        if not p["metadata"]["name"].endswith("-0"):
            unplaceable(p, GPU)
    d = fc.reconcile(NOW + 11)
    assert len(d.status["waitingFor"]) == 10
    assert all(w["stuck"] for w in d.status["waitingFor"])
    assert progressing(d)["message"].endswith(" and 11 more")
    assert progressing(d)["message"].count("Pod/") == 3
    assert f"Pod/x-{rev}-decode-1" in progressing(d)["message"]
    (event,) = stalls(d)
    assert event.message.endswith(" and 7 more")  # the 10 the status holds, 3 of them named


def test_nothing_waits_once_the_rollout_is_complete() -> None:
    fc = serving(canary())
    d = fc.reconcile(NOW + 3)
    assert progressing(d)["reason"] == reasons.ROLLOUT_COMPLETE
    assert "waitingFor" not in d.status and stalls(d) == []


def test_the_progress_deadline_names_what_it_waited_for() -> None:
    fc, new = rolled_to_the_new_router()
    prefill = fc.pods_of(f"{new}-prefill")[0]
    prefill["status"] = {
        "phase": "Pending",
        "conditions": [{"type": "Ready", "status": "False"}],
        "containerStatuses": [
            {
                "name": "engine",
                "ready": False,
                "restartCount": 0,
                "state": {
                    "waiting": {
                        "reason": "ImagePullBackOff",
                        "message": 'Back-off pulling image "pdmtp-engine:tset"',
                    }
                },
            }
        ],
    }
    fc.reconcile(NOW + 12)
    d = fc.reconcile(NOW + 12 + 3600)
    failure = d.status["rollout"]["failure"]
    assert failure.startswith(f"no progress for 600s: ready pods of {new}: prefill ")
    assert (
        f"; waiting for Pod/{prefill['metadata']['name']} (ImagePull: container engine: "
        'ImagePullBackOff: Back-off pulling image "pdmtp-engine:tset")'
    ) in failure

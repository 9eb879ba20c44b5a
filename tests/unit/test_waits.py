"""observe.waits and its parts: what an unfinished step waits for, read from pods, router
Deployments, disruption budgets and the removal gate's holds, in every revision and role.

Each kind of wait, the pods that are never waited for, the order, the bounded wording, and nothing
at all when nothing waits.
"""

from __future__ import annotations

from typing import Any

import pytest
from pdmtp.api import vocabulary as v
from pdmtp.core.objects import describe
from pdmtp.core.pods import (
    WAIT_MESSAGE_LENGTH,
    WAIT_ORDER,
    Wait,
    budget_waits,
    drain_waits,
    draining_roles,
    ordered,
    pod_waits,
    waits,
)
from pdmtp.core.rollout.removal import Waiting, listed_waits

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z
INSUFFICIENT_CPU = (
    "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available"
)


def pod(
    name: str,
    revision: str = "aaaa",
    role: str = "prefill",
    *,
    phase: str = "Running",
    ready: bool = False,
    conditions: list[dict[str, Any]] | None = None,
    containers: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
    leaving: bool = False,
    terminating: bool = False,
    created: str | None = "2027-01-15T07:59:00Z",
    node: str | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "labels": {v.LABEL_NAME: "x", v.LABEL_REVISION: revision, v.LABEL_ROLE: role},
        "annotations": {v.ANNOTATION_LEAVING: "2027-01-15T07:59:30Z"} if leaving else {},
    }
    if created:
        meta["creationTimestamp"] = created
    if terminating:
        meta["deletionTimestamp"] = "2027-01-15T07:59:50Z"
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": conditions
        if conditions is not None
        else [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    if containers is not None:
        status["containerStatuses"] = containers
    if init is not None:
        status["initContainerStatuses"] = init
    spec: dict[str, Any] = {"nodeName": node} if node else {}
    return {"kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def pending(name: str, revision: str = "aaaa", role: str = "router", message: str = "") -> Any:
    return pod(
        name,
        revision,
        role,
        phase="Pending",
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message or INSUFFICIENT_CPU,
            }
        ],
    )


def waiting(reason: str, message: str = "", restarts: int = 0, **more: Any) -> dict[str, Any]:
    state: dict[str, Any] = {"reason": reason}
    if message:
        state["message"] = message
    return {
        "name": "engine",
        "ready": False,
        "restartCount": restarts,
        "state": {"waiting": state},
        **more,
    }


def one(facts: list[Wait]) -> Wait:
    assert len(facts) == 1, facts
    return facts[0]


# ---- pods ---------------------------------------------------------------------------------------


def test_an_unschedulable_router_is_named_with_the_schedulers_message() -> None:
    w = one(pod_waits([pending("x-bbbb-router-1", "bbbb", "router")]))
    assert w == Wait(
        "Pod/x-bbbb-router-1", "bbbb", "router", "Unschedulable", INSUFFICIENT_CPU, stuck=True
    )


@pytest.mark.parametrize("reason", ["ErrImagePull", "ImagePullBackOff", "InvalidImageName"])
def test_an_image_that_cannot_be_pulled_is_one_stuck_kind_of_wait(reason: str) -> None:
    # The kubelet alternates ErrImagePull and ImagePullBackOff for one cause: one key, so the
    # alternation is not news.
    p = pod("p", phase="Pending", containers=[waiting(reason, 'Back-off pulling image "e:1"')])
    w = one(pod_waits([p]))
    assert (w.reason, w.stuck, w.key) == ("ImagePull", True, ("Pod/p", "ImagePull"))
    assert w.message == f'container engine: {reason}: Back-off pulling image "e:1"'


@pytest.mark.parametrize(
    "reason", ["CreateContainerConfigError", "CreateContainerError", "RunContainerError"]
)
def test_a_container_that_cannot_start_is_named_with_the_kubelets_reason(reason: str) -> None:
    p = pod("p", phase="Pending", containers=[waiting(reason, 'secret "hf-token" not found')])
    w = one(pod_waits([p]))
    assert (w.reason, w.stuck) == ("ContainerError", True)
    assert w.message == f'container engine: {reason}: secret "hf-token" not found'


def test_an_init_container_is_read_before_the_main_one() -> None:
    p = pod(
        "p",
        phase="Pending",
        init=[waiting("ImagePullBackOff", "no such image")],
        containers=[waiting("PodInitializing")],
    )
    assert one(pod_waits([p])).reason == "ImagePull"


def test_a_crash_loop_is_one_fact_between_restarts_too() -> None:
    last = {"terminated": {"exitCode": 1, "reason": "Error", "message": "CUDA out of memory"}}
    backing_off = pod("p", containers=[waiting("CrashLoopBackOff", restarts=4, lastState=last)])
    running_again = pod(
        "p",
        containers=[
            {
                "name": "engine",
                "ready": False,
                "restartCount": 5,
                "state": {"running": {}},
                "lastState": last,
            }
        ],
    )
    a, b = one(pod_waits([backing_off])), one(pod_waits([running_again]))
    assert a.key == b.key == ("Pod/p", "CrashLoop") and a.stuck and b.stuck
    assert a.message == "container engine: 4 restart(s), last: CUDA out of memory"
    assert b.message == "container engine: 5 restart(s), last: CUDA out of memory"


def test_a_pod_on_its_way_is_named_but_not_stuck() -> None:
    not_ready = pod(
        "p",
        conditions=[
            {"type": "Ready", "status": "False", "lastTransitionTime": "2027-01-15T07:58:00Z"}
        ],
        containers=[
            {"name": "engine", "ready": False, "restartCount": 0, "state": {"running": {}}}
        ],
    )
    creating = pod("q", phase="Pending", containers=[waiting("ContainerCreating")])
    bare = pod("r", phase="Pending", conditions=[], created=None)
    facts = {w.object: w for w in pod_waits([not_ready, creating, bare])}
    assert facts["Pod/p"] == Wait(
        "Pod/p",
        "aaaa",
        "prefill",
        "NotReady",
        "running, not Ready since 2027-01-15T07:58:00Z",
        False,
    )
    # Without a Ready transition time, the pod's creation says since when.
    assert facts["Pod/q"].message == "Pending since 2027-01-15T07:59:00Z"
    assert (facts["Pod/q"].reason, facts["Pod/q"].stuck) == ("Starting", False)
    assert (facts["Pod/r"].reason, facts["Pod/r"].message) == ("Starting", "Pending")


def test_pods_that_are_ready_or_on_their_way_out_are_not_waited_for() -> None:
    leaving_unplaced = pending("leaving-unplaced")
    leaving_unplaced["metadata"]["annotations"][v.ANNOTATION_LEAVING] = "2027-01-15T07:59:30Z"
    gone = [
        pod("ready", ready=True),
        pod("terminating", terminating=True),
        pod("leaving", leaving=True),
        leaving_unplaced,
    ]
    assert pod_waits(gone) == []


def test_every_revision_and_role_is_read() -> None:
    facts = pod_waits(
        [
            pending("x-old-router-0", "old", "router"),
            pod("x-old-decode-0", "old", "decode"),
            pod("x-new-prefill-0", "new", "prefill"),
        ]
    )
    assert {(w.revision, w.role) for w in facts} == {
        ("old", "router"),
        ("old", "decode"),
        ("new", "prefill"),
    }


# ---- drains, budgets, the removal gate ----------------------------------------------------------


def deployment(
    name: str, role: str, drain_until: str | None = None, stopped: str | None = None
) -> dict[str, Any]:
    notes = {v.ANNOTATION_DRAIN_UNTIL: drain_until} if drain_until else {}
    if stopped:
        notes[v.ANNOTATION_TRAFFIC_STOPPED] = stopped
    return {
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "labels": {v.LABEL_NAME: "x", v.LABEL_REVISION: "old", v.LABEL_ROLE: role},
            "annotations": notes,
        },
        "spec": {"replicas": 0},
    }


def test_a_drain_is_named_until_it_ends() -> None:
    running = deployment("x-old-router", "router", "2027-01-15T08:01:00Z", "2027-01-15T08:00:00Z")
    w = one(drain_waits([running, deployment("x-old-decode", "decode")], NOW))
    assert w == Wait(
        "Deployment/x-old-router",
        "old",
        "router",
        "Draining",
        "traffic stopped; the revision's pods drain until 2027-01-15T08:01:00Z",
        False,
    )
    assert drain_waits([running], NOW + 60) == []


def test_a_drain_whose_router_still_serves_waits_for_it_whatever_the_time() -> None:
    unseen = deployment("x-old-router", "router", "2027-01-15T08:01:00Z")
    (w,) = drain_waits([unseen], NOW + 3600)
    assert w.message == "routing stopped; the drain counts from when its router pods stop serving"


def budget(
    name: str = "x-old-decode",
    role: str = "decode",
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "kind": v.DISRUPTION_BUDGET_KIND,
        "metadata": {
            "name": name,
            "labels": {v.LABEL_NAME: "x", v.LABEL_REVISION: "old", v.LABEL_ROLE: role},
        },
        "spec": {"maxUnavailable": 1},
        "status": {
            "disruptionsAllowed": 0,
            "currentHealthy": 1,
            "desiredHealthy": 1,
            "expectedPods": 2,
        }
        if status is None
        else status,
    }


DRAINING = {("old", "decode")}
"""x-old-decode has a pod on a cordoned node: a drain is under way."""


def test_a_budget_that_allows_no_eviction_of_ready_pods_is_named() -> None:
    w = one(budget_waits([budget()], [], DRAINING))
    assert (w.object, w.reason, w.stuck) == (
        "PodDisruptionBudget/x-old-decode",
        "DisruptionBudget",
        False,
    )
    assert w.message == (
        "allows no eviction: 1 healthy of 2, 1 needed; a node drain cannot evict its 1 Ready "
        "pod(s) until more are Ready"
    )


def test_a_budget_over_a_stuck_role_is_stuck_itself() -> None:
    # A drain evicted one decode pod; its replacement cannot be placed: the drain waits forever.
    replacement = pending("x-old-decode-2", "old", "decode")
    elsewhere = pending("x-old-prefill-1", "old", "prefill")
    assert one(budget_waits([budget()], pod_waits([replacement]), DRAINING)).stuck
    assert not one(budget_waits([budget()], pod_waits([elsewhere]), DRAINING)).stuck


def test_a_budget_of_zero_holds_nothing_back_while_no_drain_is_under_way() -> None:
    # The default for a role that may surge: the operator moves a cordoned node's pods itself,
    # so during an ordinary rollout the budget is no wait of anyone's.
    assert budget_waits([budget()], [], set()) == []
    assert budget_waits([budget()], [], {("old", "prefill"), ("new", "decode")}) == []


def test_the_roles_draining_are_those_with_a_pod_on_a_cordoned_node() -> None:
    pods = [
        pod("x-old-decode-0", "old", "decode", ready=True, node="n1"),
        pod("x-old-prefill-0", "old", "prefill", ready=True, node="n2"),
        pod("x-new-decode-0", "new", "decode", node=None),
    ]
    assert draining_roles(pods, {"n1"}) == {("old", "decode")}
    assert draining_roles(pods, set()) == frozenset()


@pytest.mark.parametrize(
    "status",
    [
        {"disruptionsAllowed": 1, "currentHealthy": 2, "desiredHealthy": 1, "expectedPods": 2},
        {"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 1, "expectedPods": 1},
        {},
    ],
    ids=["allows-one", "nothing-healthy-to-hold", "not-yet-computed"],
)
def test_a_budget_that_holds_nothing_is_not_named(status: dict[str, Any]) -> None:
    assert budget_waits([budget(status=status)], [], DRAINING) == []


def test_a_leaving_pod_still_listed_by_its_routers_is_named() -> None:
    w = one(listed_waits([Waiting("x-old-decode-1", "old", "decode", 2)]))
    assert (w.object, w.reason, w.stuck) == ("Pod/x-old-decode-1", "ListedByRouter", False)
    assert w.message == "leaving; 2 router pod(s) of old still list it"


# ---- the whole summary --------------------------------------------------------------------------


def test_stuck_first_then_by_kind_then_by_object() -> None:
    pods_waits = waits(
        [
            pod("x-new-prefill-0", "new", "prefill"),  # NotReady
            pending("x-new-router-0", "new", "router"),  # Unschedulable
            pod("x-old-decode-2", "old", "decode", containers=[waiting("ErrImagePull")]),
            pending("x-new-decode-0", "new", "decode"),  # Unschedulable
            pod("x-old-decode-0", "old", "decode", ready=True, node="cordoned"),
        ],
        [deployment("x-old-router", "router", "2027-01-15T08:01:00Z")],
        [budget()],
        NOW,
        cordoned={"cordoned"},
    )
    # The removal gate's holds join them as `reconcile.decide` joins them.
    facts = ordered([*pods_waits, *listed_waits([Waiting("x-old-prefill-1", "old", "prefill", 1)])])
    assert [(w.object, w.reason) for w in facts] == [
        ("Pod/x-new-decode-0", "Unschedulable"),
        ("Pod/x-new-router-0", "Unschedulable"),
        ("Pod/x-old-decode-2", "ImagePull"),
        ("PodDisruptionBudget/x-old-decode", "DisruptionBudget"),  # over a stuck role
        ("Pod/x-new-prefill-0", "NotReady"),
        ("Pod/x-old-prefill-1", "ListedByRouter"),
        ("Deployment/x-old-router", "Draining"),
    ]


def test_what_to_fix_first_is_named_first() -> None:
    """What only the user resolves (capacity, an image, a config, a crash loop) comes before a
    budget that holds a drain, and that before what is on its way (starting, not Ready yet,
    being replaced, leaving, draining)."""
    fix, held = {"Unschedulable", "ImagePull", "ContainerError", "CrashLoop"}, "DisruptionBudget"
    on_its_way = {"Starting", "NotReady", "Replacing", "ListedByRouter", "Draining"}
    assert set(WAIT_ORDER) == fix | {held} | on_its_way
    assert max(WAIT_ORDER.index(k) for k in fix) < WAIT_ORDER.index(held)
    assert WAIT_ORDER.index(held) < min(WAIT_ORDER.index(k) for k in on_its_way)


def test_one_fact_per_object_and_kind() -> None:
    w = Wait("Pod/p", "a", "prefill", "NotReady", "running, not Ready", False)
    assert ordered([w, w]) == (w,)


def test_nothing_waits_when_everything_is_ready_and_nothing_drains() -> None:
    ready = [pod(f"x-aaaa-{r}-0", "aaaa", r, ready=True) for r in v.ROLES]
    healthy = budget(
        status={
            "disruptionsAllowed": 1,
            "currentHealthy": 2,
            "desiredHealthy": 1,
            "expectedPods": 2,
        }
    )
    done = deployment("x-old-router", "router", "2027-01-15T07:00:00Z", "2027-01-15T06:59:00Z")
    assert waits(ready, [done, deployment("x-old-decode", "decode")], [healthy], NOW) == ()


def fact(i: int) -> Wait:
    return Wait(f"Pod/p{i}", "a", "decode", "Unschedulable", "no GPU", True)


@pytest.mark.parametrize(
    ("count", "said"),
    [
        (0, ""),
        (1, "Pod/p0 (Unschedulable: no GPU)"),
        (
            3,
            "Pod/p0 (Unschedulable: no GPU), Pod/p1 (Unschedulable: no GPU), Pod/p2 "
            "(Unschedulable: no GPU)",
        ),
        (
            5,
            "Pod/p0 (Unschedulable: no GPU), Pod/p1 (Unschedulable: no GPU), Pod/p2 "
            "(Unschedulable: no GPU) and 2 more",
        ),
    ],
)
def test_a_description_names_three_and_counts_the_rest(count: int, said: str) -> None:
    assert describe([fact(i) for i in range(count)]) == said


def test_a_long_message_is_cut_and_kept_on_one_line() -> None:
    long = "0/500 nodes are available:\n" + "x" * 1000
    w = one(pod_waits([pending("p", message=long)]))
    assert len(w.message) == WAIT_MESSAGE_LENGTH and w.message.endswith("...")
    assert "\n" not in w.message

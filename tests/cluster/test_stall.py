"""A stall says what it waits for (issue 31, item 6), on a real API server and scheduler: a canary
whose new router asks for more cpu than any node has names that router pod and the scheduler's
reason in `Progressing` and `status.waitingFor`, and posts one Stalled Warning."""

from __future__ import annotations

from typing import Any

from builders import compat_revision, pdd
from cluster.kubehelpers import Cluster, wait_for
from kubernetes import client
from operator_harness import (
    OperatorProcess,
    condition,
    create_pdd,
    get_pdd,
    patch_spec,
    wait_settled,
)

NAME = "stuck"


def test_a_canary_whose_router_fits_no_node_names_it(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    b = pdd(NAME).mtp(3, modules=3).prefill(replicas=2).decode(replicas=2)
    b.rollout(maxSurge=1, maxUnavailable=0, drainSeconds=1, canary={"percent": 50})
    create_pdd(cluster.api_client, namespace, b.dict())
    old = wait_settled(cluster.api_client, namespace, NAME)["status"]["currentRevision"]
    # The run: the canary's router cannot be placed (a 2-core node, here no node at all).
    b.mtp(2, modules=3).router(resources={"requests": {"cpu": "4000"}})
    new = compat_revision(b.build().spec)
    patch_spec(cluster.api_client, namespace, NAME, b.dict()["spec"])

    # The new router pod is Pending for a moment before the scheduler marks it Unschedulable
    # (then Progressing rightly says RolloutInProgress): wait for the scheduler's verdict.
    seen: list[dict[str, Any] | None] = [None]

    def named() -> dict[str, Any] | None:
        cond = seen[0] = condition(get_pdd(cluster.api_client, namespace, NAME), "Progressing")
        ok = (
            cond is not None
            and cond["reason"] == "PodsUnschedulable"
            and f"Pod/{NAME}-{new}-router-" in cond["message"]
        )
        return cond if ok else None

    try:
        cond = wait_for(named, "PodsUnschedulable naming the new router pod", 60, interval=0.3)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; Progressing last said {seen[0]}") from exc
    print(f"Progressing={cond['status']} {cond['reason']}: {cond['message']}")
    assert "Insufficient cpu" in cond["message"], cond["message"]
    obj = get_pdd(cluster.api_client, namespace, NAME)
    router = [w for w in obj["status"]["waitingFor"] if w["role"] == "router"]
    assert router and router[0]["reason"] == "Unschedulable" and router[0]["stuck"], router
    assert router[0]["revision"] in (old, new)
    assert obj["status"]["currentRevision"] == old, "the old revision keeps serving"

    def stalled() -> list[client.CoreV1Event]:
        items = client.CoreV1Api(cluster.api_client).list_namespaced_event(namespace).items
        return [
            e
            for e in items
            if e.involved_object.name == NAME and e.reason == "Stalled" and e.type == "Warning"
        ]

    def names_the_new_router(events: list[client.CoreV1Event]) -> bool:
        return any(
            "Insufficient cpu" in e.message and f"{NAME}-{new}-router-" in e.message for e in events
        )

    # Every revision's router takes spec.router, so the old one's re-rendered pod is stuck too,
    # and its Warning may come first: each stuck pod gets its own when it appears.
    seen_events: list[list[client.CoreV1Event]] = [[]]

    def stalled_on_the_new_router() -> list[client.CoreV1Event] | None:
        events = seen_events[0] = stalled()
        return events if names_the_new_router(events) else None

    try:
        events = wait_for(
            stalled_on_the_new_router, "a Stalled Warning naming the new router", 20, interval=0.3
        )
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; Stalled: {[e.message for e in seen_events[0]]}") from exc
    print("\n".join(f"{e.type} {e.reason} (x{e.count}): {e.message}" for e in events))
    # Posted when the stall appeared, not at every reconcile: one per router pod stuck.
    stuck_routers = {w["object"] for w in router}
    assert sum(e.count or 1 for e in events) <= len(stuck_routers) + 1, [e.message for e in events]

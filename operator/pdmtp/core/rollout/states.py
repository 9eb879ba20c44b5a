"""The planner's view of each revision, read off its Deployments and pods (`RevisionState`):
replicas, pods, Ready pods, and how many engines its Ready routers list."""

from __future__ import annotations

from collections.abc import Iterable

from pdmtp.api import vocabulary as v
from pdmtp.core.objects import (
    Obj,
    annotations_of,
    created_at,
    engine_url,
    is_leaving,
    is_terminating,
    labels_of,
    parse_time,
    pod_ready,
    serves,
)
from pdmtp.core.render.membership import container_args, router_urls
from pdmtp.core.revision_state import RevisionState, RoleState, steady_listing


def _parked_replicas(deployment: Obj) -> int:
    """The replicas the planner asked of a router held at zero (render.router_deployment)."""
    parked = annotations_of(deployment).get(v.ANNOTATION_ROUTER_PARKED, "")
    return int(parked) if parked.isdigit() else 0


def _parked(deployment: Obj) -> bool:
    replicas = int((deployment.get("spec") or {}).get("replicas") or 0)
    return replicas == 0 and _parked_replicas(deployment) > 0


def _role_state(
    deployment: Obj | None,
    pods: list[Obj],
    routed: frozenset[str] | None = None,
    steady: frozenset[str] | None = None,
) -> RoleState:
    """One (revision, role) as the planner counts it; for an engine role, `routed` holds the
    engine URLs its revision's Ready router pods list (None for the router role itself) and
    `steady` those its router keeps listed through its own rollout (None: no router
    Deployment; `revision_state.steady_listing`)."""
    replicas = int(((deployment or {}).get("spec") or {}).get("replicas") or 0)
    if deployment is not None and replicas == 0:
        # A parked router keeps the planner's intent (render.router_deployment).
        replicas = _parked_replicas(deployment)
    ready = sum(serves(p) for p in pods)
    if routed is None:
        return RoleState(replicas, len(pods), ready)
    listed = [p for p in pods if pod_ready(p) and _url_of(p) in routed]
    staying = [p for p in listed if not is_leaving(p)]
    return RoleState(
        replicas,
        len(pods),
        ready,
        unlisted=ready - len(staying),
        still_listed=len(listed) - len(staying),
        dropping=0 if steady is None else sum(_url_of(p) not in steady for p in staying),
    )


def _url_of(pod: Obj) -> str | None:
    ip = (pod.get("status") or {}).get("podIP")
    return engine_url(ip) if ip else None


def ready_listings(router_pods: Iterable[Obj]) -> list[frozenset[str]]:
    """The engine URLs each Ready router pod among `router_pods` lists; their union is what
    clients reach (a router pod that is not Ready, or is terminating, is out of its Service)."""
    return [router_urls(container_args(p.get("spec") or {})) for p in router_pods if pod_ready(p)]


def _steady_urls(router: Obj | None, listings: list[frozenset[str]]) -> frozenset[str] | None:
    """The engine URLs `router` keeps listed through its own rollout (`steady_listing`), given
    what its Ready pods list."""
    if router is None:
        return None
    spec = router.get("spec") or {}
    template = router_urls(container_args((spec.get("template") or {}).get("spec") or {}))
    replicas = int(spec.get("replicas") or 0) or _parked_replicas(router)
    return steady_listing(listings, template, replicas)


def revision_states(deployments: Iterable[Obj], pods: Iterable[Obj]) -> list[RevisionState]:
    """One RevisionState per revision that has a Deployment or a pod, oldest first."""
    by_workload: dict[tuple[str, str], Obj] = {}
    pods_of: dict[tuple[str, str], list[Obj]] = {}
    revisions: set[str] = set()
    for d in deployments:
        key = (labels_of(d).get(v.LABEL_REVISION, ""), labels_of(d).get(v.LABEL_ROLE, ""))
        if key[0] and not is_terminating(d):
            by_workload[key] = d
            revisions.add(key[0])
    for p in pods:
        key = (labels_of(p).get(v.LABEL_REVISION, ""), labels_of(p).get(v.LABEL_ROLE, ""))
        if key[0]:
            pods_of.setdefault(key, []).append(p)
            revisions.add(key[0])
    states = []
    for rev in revisions:
        created = [created_at(by_workload[(rev, r)]) for r in v.ROLES if (rev, r) in by_workload]
        router = by_workload.get((rev, "router"))
        marks = annotations_of(router) if router else {}
        listings = ready_listings(pods_of.get((rev, "router"), []))
        routed = frozenset[str]().union(*listings)
        steady = _steady_urls(router, listings)
        roles = {
            r: _role_state(
                by_workload.get((rev, r)),
                pods_of.get((rev, r), []),
                routed if r in v.ENGINE_ROLES else None,
                steady,
            )
            for r in v.ROLES
        }
        states.append(
            RevisionState(
                revision=rev,
                prefill=roles["prefill"],
                decode=roles["decode"],
                router=roles["router"],
                drain_until=parse_time(marks.get(v.ANNOTATION_DRAIN_UNTIL)),
                traffic_stopped=parse_time(marks.get(v.ANNOTATION_TRAFFIC_STOPPED)),
                created=min((c for c in created if c is not None), default=float("inf")),
                router_parked=router is not None and _parked(router),
            )
        )
    return sorted(states, key=lambda s: (s.created, s.revision))

"""Each revision as the core knows it, below both the rollout and the verification that judges it:
its workloads per role as observed (`RevisionState`, read off the Deployments and pods by
`rollout.states`), how established it is, what its router keeps listed through its own
rollout, and what its verdict does to its rollout (`Gate`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pdmtp.api.vocabulary import EngineRole, by_role


@dataclass(frozen=True)
class RoleState:
    """One (revision, role) workload as observed."""

    replicas: int = 0
    """The workload's desired replicas (Deployment spec.replicas)."""
    pods: int = 0
    """Pods that exist, terminating ones included: they still hold GPUs."""
    ready: int = 0
    """Ready pods that are neither terminating nor leaving routing."""
    unlisted: int = 0
    """Of `ready`, those no Ready router pod of the revision lists: its router has not rolled to
    them yet, so no client reaches them."""
    still_listed: int = 0
    """Ready pods marked leaving that a Ready router pod of the revision still lists: clients
    reach them until the router has rolled away from them."""
    dropping: int = 0
    """Of the listed, those the router Deployment's own rollout may take from clients
    (`steady_listing`): its template no longer lists them, or only router pods that the rollout
    may remove first do (a revision rolled away, then back)."""

    @property
    def listed(self) -> int:
        """Ready, not leaving, and listed by a Ready router pod: the capacity the planner counts
        (a pod marked leaving is already spent, wherever it is still listed)."""
        return self.ready - self.unlisted

    @property
    def kept(self) -> int:
        """Listed now and by the router's template: capacity that stays listed while the router
        rolls, what the planner counts toward the floor."""
        return self.listed - self.dropping

    @property
    def reached(self) -> int:
        """Ready pods a Ready router pod lists, leaving or not: what clients reach now."""
        return self.listed + self.still_listed

    @property
    def settled(self) -> bool:
        """Every wanted pod exists, is ready and listed; none is on its way in or out."""
        return self.pods == self.replicas == self.ready and not self.unlisted


def steady_listing(
    ready_listings: Iterable[frozenset[str]], template: frozenset[str], replicas: int
) -> frozenset[str]:
    """The engines a router Deployment keeps listed through its own rollout, given what each of
    its Ready pods lists, what its template lists, and its replicas.

    The rollout keeps `replicas` pods Ready (maxUnavailable 0) but removes old-template pods,
    oldest ReplicaSet first, before a new one is Ready whenever it holds a surplus. So an engine
    stays listed if the template lists it and a Ready pod of the template does (the rollout never
    removes those), or if a Ready pod lists it and fewer than `replicas` leave it out (any
    `replicas` of them that survive include one that lists it)."""
    listings = list(ready_listings)
    if template in listings:
        return template
    return frozenset(
        e
        for e in template
        if any(e in one for one in listings) and sum(e not in one for one in listings) < replicas
    )


@dataclass(frozen=True)
class RevisionState:
    """All workloads of one revision as observed."""

    revision: str
    prefill: RoleState = RoleState()
    decode: RoleState = RoleState()
    router: RoleState = RoleState()
    drain_until: float | None = None
    """Set when the router was turned off: pods stay at least until then (epoch seconds)."""
    traffic_stopped: float | None = None
    """When the operator first saw no router pod of a draining revision serve (epoch seconds,
    rounded up): the drain ends no earlier than this plus drainSeconds (`planner._drain`)."""
    created: float = 0.0
    router_parked: bool = False
    """The router Deployment is held at zero replicas for want of a routable membership
    (`render.router_deployment`); `router.replicas` keeps the planner's intent."""

    def role(self, role: EngineRole) -> RoleState:
        return by_role(role, self.prefill, self.decode)

    @property
    def serving(self) -> bool:
        """May still receive traffic: a router pod is Ready (whatever its Deployment asks for,
        its pod answers until the Deployment controller removes it). The drain counts from
        when this ends (invariant 4)."""
        return self.router.ready > 0

    @property
    def reachable(self) -> bool:
        """Clients reach its engines, and will a moment from now: its router Deployment keeps
        replicas (not turned off for a drain, not parked) and a router pod is Ready. Only the
        listed pods of reachable revisions count towards the availability floor (invariant 3):
        a Ready router pod whose Deployment was scaled to zero is about to go."""
        return self.serving and self.router.replicas > 0 and not self.router_parked

    @property
    def routed(self) -> bool:
        """Has (or may still have) a router: turning it off requires a drain."""
        return self.router.replicas > 0 or self.router.pods > 0

    @property
    def draining(self) -> bool:
        return self.drain_until is not None


def establishment(state: RevisionState) -> float:
    """Sort key, least established first: the newer revision first.

    Age, not ready counts: counts shift as the planner shrinks a revision, and an order that can
    flip mid-roll would drain the revision it meant to keep (invariant 5).
    """
    return -state.created


@dataclass(frozen=True)
class Gate:
    """What the update revision's verdict does to its rollout: `core.verification` makes it
    (`revisions.rollout_gate`), `core.rollout` obeys it (`steering`)."""

    failure: str | None = None
    """Why the revision failed its verdict (the rollout fails as on its deadline); None if not."""
    finding: str | None = None
    """The failed verdict's reason (a Verified condition reason)."""
    awaiting: str | None = None
    """Why the old revision keeps its last pods (no verdict yet); None if free."""
    release_at_deadline: bool = False
    """Mode Rollback: no verdict by progressDeadlineSeconds ends the hold, and the rollout goes
    on unverified (mode Gate fails it instead)."""
    verified: bool = False
    """An auto-promoting canary may go on."""

"""The rollout planner: one pure step from observed revisions to the replicas each should have.

`plan(observed, target, policy, now)` looks only at what it is given (no memory between calls), so
an operator restarted at any point continues from what it observes (invariant 6). The invariants
it keeps (DESIGN.md section 5):

1. a revision's router pairs only that revision's pods (rendering; not decided here);
2. a revision gets traffic (router replicas > 0) only with >= 1 ready prefill and decode;
3. per role, ready pods across serving revisions stay >= target - maxUnavailable, and all pods
   (terminating ones included) stay <= target + maxSurge;
4. an old revision loses its router before its last prefill or decode pod, and its pods stay
   for drainSeconds after that;
5. when superseded (A -> B -> C), the newest old revision (B) is drained first and the oldest
   (A, the most established) keeps serving longest;
7. with no target revision (an incompatible spec) nothing changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pdmtp.core.vocabulary import ENGINE_ROLES, EngineRole


@dataclass(frozen=True)
class RoleState:
    """One (revision, role) workload as observed."""

    replicas: int = 0
    """The workload's desired replicas (Deployment spec.replicas)."""
    pods: int = 0
    """Pods that exist, terminating ones included: they still hold GPUs."""
    ready: int = 0
    """Ready pods that are not terminating."""


@dataclass(frozen=True)
class RevisionState:
    """All workloads of one revision as observed."""

    revision: str
    prefill: RoleState = RoleState()
    decode: RoleState = RoleState()
    router: RoleState = RoleState()
    drain_until: float | None = None
    """Set when the router was turned off: pods stay until then (epoch seconds)."""
    created: float = 0.0

    def role(self, role: EngineRole) -> RoleState:
        return self.prefill if role == "prefill" else self.decode

    @property
    def serving(self) -> bool:
        """Receives traffic: a ready router that is not being drained."""
        return self.router.ready > 0

    @property
    def routed(self) -> bool:
        """Has (or may still have) a router: turning it off requires a drain."""
        return self.router.replicas > 0 or self.router.pods > 0

    @property
    def draining(self) -> bool:
        return self.drain_until is not None


@dataclass(frozen=True)
class Target:
    """What the spec asks for; `revision` is None when the spec is incompatible."""

    revision: str | None
    prefill: int
    decode: int
    router: int

    def replicas(self, role: EngineRole) -> int:
        return self.prefill if role == "prefill" else self.decode


@dataclass(frozen=True)
class Policy:
    max_surge: int
    max_unavailable: int
    drain_seconds: int


@dataclass(frozen=True)
class RevisionPlan:
    """What one revision's workloads should be after this step."""

    revision: str
    prefill: int
    decode: int
    router: int
    drain_until: float | None = None
    delete: bool = False

    def replicas(self, role: EngineRole) -> int:
        return self.prefill if role == "prefill" else self.decode


@dataclass(frozen=True)
class Step:
    """The planner's answer: every revision's plan, and when to look again."""

    revisions: tuple[RevisionPlan, ...]
    complete: bool
    """The target revision alone exists, at its target replicas, all ready and serving."""
    requeue_after: float | None = None

    def for_revision(self, revision: str) -> RevisionPlan | None:
        return next((p for p in self.revisions if p.revision == revision), None)


def _unchanged(state: RevisionState) -> RevisionPlan:
    return RevisionPlan(
        state.revision,
        state.prefill.replicas,
        state.decode.replicas,
        state.router.replicas,
        state.drain_until,
    )


def establishment(state: RevisionState) -> float:
    """Sort key, least established first: the newer revision first.

    Age, not ready counts: counts shift as the planner shrinks a revision, and an order that can
    flip mid-roll would drain the revision it meant to keep (invariant 5).
    """
    return -state.created


def availability_floor(target: Target, policy: Policy) -> dict[EngineRole, int]:
    """Ready serving pods each role keeps during a roll (invariant 3's lower bound)."""
    floor = {r: max(0, target.replicas(r) - policy.max_unavailable) for r in ENGINE_ROLES}
    if min(floor.values()) == 0:
        # Serving needs both roles: if one may drop to no ready pods, so may the deployment's
        # capacity, and holding the other role's floor could only deadlock the roll.
        return dict.fromkeys(ENGINE_ROLES, 0)
    return floor


def plan(observed: Sequence[RevisionState], target: Target, policy: Policy, now: float) -> Step:
    """One step of the rollout towards `target` (see the module docstring for the invariants)."""
    if target.revision is None:
        # Invariant 7: an incompatible spec changes nothing; whatever serves keeps serving.
        return Step(tuple(_unchanged(s) for s in observed), complete=False)

    update = next((s for s in observed if s.revision == target.revision), None)
    if update is None:
        update = RevisionState(target.revision, created=now)
    olds = sorted((s for s in observed if s.revision != target.revision), key=establishment)

    ceiling = {r: target.replicas(r) + policy.max_surge for r in ENGINE_ROLES}
    floor = availability_floor(target, policy)
    available = {
        r: sum(s.role(r).ready for s in (update, *olds) if s.serving) for r in ENGINE_ROLES
    }

    # 1. Scale the update revision up within the surge budget.
    update_replicas: dict[EngineRole, int] = {}
    for r in ENGINE_ROLES:
        others = sum(max(s.role(r).replicas, s.role(r).pods) for s in olds)
        allowed = ceiling[r] - others
        current = update.role(r).replicas
        update_replicas[r] = min(target.replicas(r), max(current, allowed, 0))

    # 3. Shrink, un-route and retire old revisions, least established first (invariant 5).
    old_plans: list[RevisionPlan] = []
    requeue: float | None = None
    may_unroute = True
    for old in olds:
        old_plan, available = _step_old(old, available, floor, policy, now, may_unroute)
        old_plans.append(old_plan)
        # A more established revision keeps its traffic until every less established one
        # has lost its own (invariant 5).
        may_unroute = may_unroute and not (old_plan.router > 0)
        if old_plan.drain_until is not None and not old_plan.delete:
            wait = max(old_plan.drain_until - now, 0.0)
            requeue = wait if requeue is None else min(requeue, wait)

    # 4. Superseded rollouts can wedge: two old revisions each hold a role's last pod, the
    #    update revision has none of that role and no room for one, and neither old revision can
    #    be un-routed without the other dropping below the floor. Grant the update revision one
    #    pod beyond maxSurge for that role: a brief extra GPU beats losing serving capacity.
    pairable = update.prefill.ready >= 1 and update.decode.ready >= 1
    wedged = (
        not pairable
        and sum(o.routed and not o.draining for o in olds) >= 2
        and not any(o.draining for o in olds)
        and all(p == _unchanged(o) for p, o in zip(old_plans, olds, strict=True))
    )
    if wedged:
        for r in ENGINE_ROLES:
            if update_replicas[r] == 0 and target.replicas(r) > 0:
                update_replicas[r] = 1

    # 2. Route to the update revision once it pairs a ready prefill with a ready decode.
    update_plan = RevisionPlan(
        target.revision,
        update_replicas["prefill"],
        update_replicas["decode"],
        target.router if pairable else 0,
    )

    complete = (
        not olds
        and all(update.role(r).replicas == target.replicas(r) for r in ENGINE_ROLES)
        and all(update.role(r).ready == target.replicas(r) for r in ENGINE_ROLES)
        and all(update.role(r).pods == target.replicas(r) for r in ENGINE_ROLES)
        # A router restarting for new engine membership is no rollout: ready is enough.
        and update.router.ready >= target.router
    )
    return Step((*old_plans, update_plan), complete, requeue)


def _step_old(
    old: RevisionState,
    available: dict[EngineRole, int],
    floor: dict[EngineRole, int],
    policy: Policy,
    now: float,
    may_unroute: bool,
) -> tuple[RevisionPlan, dict[EngineRole, int]]:
    """The plan for one old revision and the availability left after it."""
    keep = _unchanged(old)
    if old.draining:
        # Invariant 4: pods stay until the drain ends and the router's pods are gone.
        assert old.drain_until is not None
        retire = now >= old.drain_until and old.router.pods == 0
        return replace(keep, router=0, delete=retire), available
    if not old.routed:
        # Never took traffic: nothing to drain, retire at once.
        return replace(keep, prefill=0, decode=0, router=0, delete=True), available

    without = {r: available[r] - (old.role(r).ready if old.serving else 0) for r in ENGINE_ROLES}
    if may_unroute and all(without[r] >= floor[r] for r in ENGINE_ROLES):
        # Everything else carries the floor: stop routing here and start the drain. Its pods
        # are left alone in this step; they go when the drain ends.
        return replace(keep, router=0, drain_until=now + policy.drain_seconds), without

    left = dict(available)
    replicas: dict[EngineRole, int] = {}
    for r in ENGINE_ROLES:
        state = old.role(r)
        spare = max(left[r] - floor[r], 0) if old.serving else state.ready
        # Keep one pod of each role while the router may still send it traffic (invariant 4).
        removable = min(spare, max(state.ready - 1, 0))
        replicas[r] = max(1, min(state.replicas, state.ready - removable))
        if old.serving:
            left[r] -= removable
    return replace(keep, prefill=replicas["prefill"], decode=replicas["decode"]), left

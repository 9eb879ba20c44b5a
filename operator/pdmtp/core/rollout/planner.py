"""The rollout planner: one pure step from observed revisions to the replicas each should have.

`plan(observed, target, policy, now)` looks only at what it is given (no memory between calls), so
an operator restarted at any point continues from what it observes (invariant 6). It answers with
a `Step`: every revision's replicas, and an outcome, as LWS's DisaggregatedSet planner does:

- `Progress`: something changes now, or something the step waits for is under way (pods starting
  or terminating, a drain running);
- `Complete`: the target revision alone runs, at its replicas, all ready and serving;
- `Blocked`: nothing changes and nothing is under way, so waiting cannot help; `reason` says why
  (an incompatible spec, or a policy that allows no move);
- `Paused`: the policy froze the rollout: nothing moves but drains already started, which finish;
- `Held`: a canary reached its share next to the old revision and waits for promotion.

A canary (`Policy.canary_percent`) rolls the new revision to that share of each role's replicas
(at least one pod) while the most established serving revision (the anchor) keeps the rest and
its traffic; the routers of the two are scaled so the new revision's routers are that share of
the client Service's endpoints (`canary_routers`: the anchor's grow for a share under 50%, the
canary's for one above). Promotion drops the canary from the policy
and the rollout goes on from where it holds.

The invariants it keeps (docs/design.md, "Rollout invariants"):

1. a revision's router pairs only that revision's pods (rendering; not decided here);
2. a revision gets traffic (router replicas > 0) only with >= 1 ready prefill and decode;
3. per role, ready pods a client can reach (listed by a Ready router pod of a
   `RevisionState.reachable` revision) stay >= target - maxUnavailable, and all pods
   (terminating ones included) stay <= target + maxSurge;
4. an old revision loses its router before its last prefill or decode pod, and its pods stay
   for drainSeconds after its last router pod stops serving (`_drain`);
5. when superseded (A -> B -> C), the newest old revision (B) is drained first and the oldest
   (A, the most established) keeps serving longest;
7. with no target revision (an incompatible spec) nothing changes.

A step, in order:

1. scale the update revision up within the surge budget;
2. shrink, un-route and retire old revisions, least established first;
3. unwedge a superseded roll (one pod beyond maxSurge, see `_unwedge`);
4. route to the update revision once it pairs a ready prefill with a ready decode.

Worked example, prefill only (decode moves the same way), target 2 replicas, maxSurge 1,
maxUnavailable 0 (floor 2, ceiling 3), old revision A serving 2 ready pods:

- t0: B does not exist. Step 1: A holds 2 pods, so B may have 3 - 2 = 1. B: 0 -> 1.
- t1: B's pod is starting (1 pod, 0 ready). Nothing else may move: Progress, a wait.
- t2: B's pod is ready and B's decode too, so step 4 routes B (router 0 -> 1).
- t3: B's router pod is Ready and lists B's pod: B serves 1, A 2: 3 ready serving. Step 2:
  without A, 1 < floor 2, so A keeps its router, but 3 - 2 = 1 pod is spare: A 2 -> 1. Once
  that pod is gone, step 1 lets B have 2.
- t5: B serves 2 ready = floor: A is un-routed, its drain starts; its pods stay drainSeconds.
- t5 + drainSeconds: A is retired (Deployments deleted). Then Complete.

With maxSurge 0, maxUnavailable 1 (floor 1, ceiling 2): t0: B may have 2 - 2 = 0 pods, so step 2
first shrinks A to 1 (spare 2 - 1 = 1), freeing room: one pair is replaced at a time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from pdmtp.api.vocabulary import ENGINE_ROLES, EngineRole, by_role
from pdmtp.core.revision_state import RevisionState, establishment

PlanOutcome = Literal["Progress", "Complete", "Blocked", "Paused", "Held"]
MAX_CANARY_ROUTERS = 20
"""The anchor's routers during a canary hold are capped: routers are cheap, not free."""


@dataclass(frozen=True)
class Target:
    """What the spec asks for; `revision` is None when the spec is incompatible."""

    revision: str | None
    prefill: int
    decode: int
    router: int

    def replicas(self, role: EngineRole) -> int:
        return by_role(role, self.prefill, self.decode)


@dataclass(frozen=True)
class Policy:
    max_surge: int
    max_unavailable: int
    drain_seconds: int
    paused: bool = False
    canary_percent: int | None = None
    """Hold at this share of the new revision until promoted (None: no canary, or promoted)."""
    verifying: bool = False
    """The update revision awaits its verdict: no old revision is un-routed, each keeps a pod
    of each role (a rollback must find it serving)."""


@dataclass(frozen=True)
class RevisionPlan:
    """What one revision's workloads should be after this step."""

    revision: str
    prefill: int
    decode: int
    router: int
    drain_until: float | None = None
    traffic_stopped: float | None = None
    delete: bool = False

    def replicas(self, role: EngineRole) -> int:
        return by_role(role, self.prefill, self.decode)

    @property
    def drain_ends(self) -> float | None:
        """When the drain can end, once its traffic is known to have stopped (None: no drain,
        or its router still serves)."""
        return None if self.traffic_stopped is None else self.drain_until


@dataclass(frozen=True)
class Step:
    """The planner's answer: every revision's plan, the outcome, and when to look again."""

    revisions: tuple[RevisionPlan, ...]
    outcome: PlanOutcome
    reason: str = ""
    """Why the roll is Blocked (empty otherwise)."""
    requeue_after: float | None = None

    @property
    def complete(self) -> bool:
        return self.outcome == "Complete"

    @property
    def blocked(self) -> bool:
        return self.outcome == "Blocked"

    def for_revision(self, revision: str) -> RevisionPlan | None:
        return next((p for p in self.revisions if p.revision == revision), None)


def unchanged(state: RevisionState) -> RevisionPlan:
    """The plan that leaves a revision exactly as it is."""
    return RevisionPlan(
        state.revision,
        state.prefill.replicas,
        state.decode.replicas,
        state.router.replicas,
        state.drain_until,
        state.traffic_stopped,
    )


def availability_floor(target: Target, policy: Policy) -> dict[EngineRole, int]:
    """Ready pods a client can reach that each role keeps during a roll (invariant 3's lower
    bound)."""
    floor = {r: max(0, target.replicas(r) - policy.max_unavailable) for r in ENGINE_ROLES}
    if min(floor.values()) == 0:
        # Serving needs both roles: if one may drop to no ready pods, so may the deployment's
        # capacity, and holding the other role's floor could only deadlock the roll.
        return dict.fromkeys(ENGINE_ROLES, 0)
    return floor


def reachable_ready(states: Iterable[RevisionState], role: EngineRole) -> int:
    """Ready pods of `role`, not leaving, that a Ready router pod of a reachable revision lists:
    what the planner holds at the availability floor. A pod Ready a moment ago is capacity only
    once its router has rolled to list it (issue 40: an old revision retired while the new
    router's pod that listed its last group was still starting left clients one group), and
    only while the router's template still lists it (`RoleState.kept`)."""
    return sum(s.role(role).kept for s in states if s.reachable)


def clients_reach(states: Iterable[RevisionState], role: EngineRole) -> int:
    """Ready pods of `role` that a Ready router pod of a reachable revision lists, leaving ones
    too: what clients reach now, the floor as the invariant checker judges it."""
    return sum(s.role(role).reached for s in states if s.reachable)


def canary_replicas(target: Target, percent: int) -> dict[EngineRole, int]:
    """Each role's share of the new revision during a canary: at least one pod."""
    return {r: max(1, math.ceil(target.replicas(r) * percent / 100)) for r in ENGINE_ROLES}


def canary_routers(routers: int, percent: int) -> tuple[int, int]:
    """(the canary's routers, the anchor's) giving the canary `percent` of all router endpoints:
    the side with the smaller share keeps `routers`, the other grows (up to MAX_CANARY_ROUTERS)."""
    if percent <= 50:
        return routers, min(
            MAX_CANARY_ROUTERS, max(routers, round(routers * (100 - percent) / percent))
        )
    return min(
        MAX_CANARY_ROUTERS, max(routers, round(routers * percent / (100 - percent)))
    ), routers


def plan(observed: Sequence[RevisionState], target: Target, policy: Policy, now: float) -> Step:
    """One step of the rollout towards `target` (see the module docstring)."""
    if target.revision is None:
        # Invariant 7: an incompatible spec changes nothing; whatever serves keeps serving.
        return Step(
            tuple(unchanged(s) for s in observed),
            "Blocked",
            "the spec is incompatible: no new revision starts",
        )
    if policy.paused:
        return _paused(observed, target, policy, now)

    update = next((s for s in observed if s.revision == target.revision), None)
    if update is None:
        update = RevisionState(target.revision, created=now)
    olds = sorted((s for s in observed if s.revision != target.revision), key=establishment)
    return _plan(update, olds, target, policy, now, _hold(olds, target, policy))


@dataclass(frozen=True)
class _Hold:
    """A canary hold: the new revision's share, and what the anchor keeps."""

    anchor: str
    share: dict[EngineRole, int]
    keep: dict[EngineRole, int]
    routers: int
    """The anchor's routers."""
    canary_routers: int


def _hold(olds: Sequence[RevisionState], target: Target, policy: Policy) -> _Hold | None:
    if policy.canary_percent is None:
        return None
    serving = [s for s in olds if s.serving and not s.draining]
    if not serving:
        return None  # nothing to hold next to: a plain rollout
    anchor = max(serving, key=establishment)
    share = canary_replicas(target, policy.canary_percent)
    keep: dict[EngineRole, int] = {}
    for r in ENGINE_ROLES:
        room = target.replicas(r) + policy.max_surge - share[r]
        keep[r] = min(max(1, target.replicas(r) - share[r]), room, anchor.role(r).replicas)
        if keep[r] < 1:
            return None  # no room for both revisions: the canary degenerates to a rollout
    mine, theirs = canary_routers(target.router, policy.canary_percent)
    return _Hold(anchor.revision, share, keep, theirs, mine)


def _paused(observed: Sequence[RevisionState], target: Target, policy: Policy, now: float) -> Step:
    """Frozen: every revision as it is, but a drain goes on and one that ran out retires."""
    plans = [
        _drain(s, policy, now) if s.revision != target.revision and s.draining else unchanged(s)
        for s in observed
    ]
    return Step(tuple(plans), "Paused", "spec.rollout.paused is set")


def _drain(old: RevisionState, policy: Policy, now: float) -> RevisionPlan:
    """A draining revision's plan (invariant 4): its pods stay drainSeconds after its traffic
    stopped, counted from what is recorded in the API, never from the operator's memory.

    While a router pod still serves (the Deployment controller has not removed it yet, which
    after a control-plane outage can take seconds or minutes) the drain's end moves with the
    clock. The first time the operator sees none serve, it records that moment (rounded up to
    the second the annotation holds) and moves the end to it plus drainSeconds: the traffic
    stopped before it was seen, so the drain is never shorter, and an operator that was down
    or restarted meanwhile records it late (a longer drain), never early. Times are rounded up
    because the annotations hold whole seconds.
    """
    assert old.drain_until is not None
    keep = replace(unchanged(old), router=0)
    if old.serving:
        return replace(
            keep, drain_until=max(old.drain_until, math.ceil(now + policy.drain_seconds))
        )
    if old.traffic_stopped is None:
        stopped = math.ceil(now)
        end = max(old.drain_until, stopped + policy.drain_seconds)
        return replace(keep, drain_until=end, traffic_stopped=stopped)
    return replace(keep, delete=now >= old.drain_until and old.router.pods == 0)


def _plan(
    update: RevisionState,
    olds: Sequence[RevisionState],
    target: Target,
    policy: Policy,
    now: float,
    hold: _Hold | None,
) -> Step:
    assert target.revision is not None
    floor = availability_floor(target, policy)
    goal = {r: target.replicas(r) if hold is None else hold.share[r] for r in ENGINE_ROLES}
    if update.reachable:
        for r in ENGINE_ROLES:
            # A goal below its replicas (a canary's share after a scale-down) never takes the
            # ready pods the floor still needs from it: the anchor does not grow to carry them.
            needed = floor[r] - reachable_ready(olds, r)
            goal[r] = max(goal[r], min(update.role(r).replicas, needed))

    # 1. Scale the update revision up within the surge budget (to its share, in a canary).
    ceiling = {r: target.replicas(r) + policy.max_surge for r in ENGINE_ROLES}
    update_replicas: dict[EngineRole, int] = {}
    for r in ENGINE_ROLES:
        others = sum(max(s.role(r).replicas, s.role(r).pods) for s in olds)
        # Its own pods beyond its replicas (terminating after a scale-down mid-roll) still
        # hold GPUs: a scale-up right after one waits for them as for an old revision's.
        surplus = max(update.role(r).pods - update.role(r).replicas, 0)
        allowed = ceiling[r] - others - surplus
        update_replicas[r] = min(goal[r], max(update.role(r).replicas, allowed, 0))
        if update.draining and update.drain_until is not None and now < update.drain_until:
            # Rolled back to while its drain runs: its pods may still finish requests.
            update_replicas[r] = max(update_replicas[r], update.role(r).replicas)

    # 2. Shrink, un-route and retire old revisions, least established first (invariant 5).
    # Only what a client can reach counts: a revision just un-routed may keep a Ready router
    # pod for a moment (the Deployment controller has not removed it yet), and its pods
    # counted there would let an older revision shrink below the floor.
    available = {r: reachable_ready((update, *olds), r) for r in ENGINE_ROLES}
    old_plans: list[RevisionPlan] = []
    requeue: float | None = None
    may_unroute = not policy.verifying
    for old in olds:
        anchor = hold is not None and old.revision == hold.anchor
        least = hold.keep if hold is not None and anchor else None
        old_plan, available = _step_old(old, available, floor, policy, now, may_unroute, least)
        if hold is not None and anchor:
            old_plan = replace(old_plan, router=hold.routers)
        old_plans.append(old_plan)
        # A more established revision keeps its traffic until every less established one
        # has lost its own (invariant 5).
        may_unroute = may_unroute and not (old_plan.router > 0)
        if old_plan.drain_until is not None and not old_plan.delete:
            # A drain whose router still serves ends no earlier than drainSeconds from now.
            end = old_plan.drain_ends or now + policy.drain_seconds
            wait = max(end - now, 0.0)
            requeue = wait if requeue is None else min(requeue, wait)

    # 3. Unwedge a superseded roll.
    pairable = update.prefill.ready >= 1 and update.decode.ready >= 1
    if not pairable and _wedged(olds, old_plans):
        for r in ENGINE_ROLES:
            if update_replicas[r] == 0 and target.replicas(r) > 0:
                update_replicas[r] = 1

    # 4. Route to the update revision once it pairs a ready prefill with a ready decode.
    # A revision rolled back to keeps its drain mark until the drain is over: its pods that
    # served before may still finish requests, so none goes earlier (invariant 4).
    draining = update.drain_until if update.draining and now < (update.drain_until or 0) else None
    if draining is not None:
        wait = draining - now
        requeue = wait if requeue is None else min(requeue, wait)
    update_plan = RevisionPlan(
        target.revision,
        update_replicas["prefill"],
        update_replicas["decode"],
        (target.router if hold is None else hold.canary_routers) if pairable else 0,
        drain_until=draining,
        traffic_stopped=None if draining is None else update.traffic_stopped,
    )
    plans = (*old_plans, update_plan)

    if hold is not None and _held(update, olds, hold, goal):
        return Step(plans, "Held", f"canary holds next to {hold.anchor}", requeue)
    if _complete(update, olds, target):
        return Step(plans, "Complete", requeue_after=requeue)
    if _moves(plans, (*olds, update)) or _under_way(update, olds):
        return Step(plans, "Progress", requeue_after=requeue)
    return Step(plans, "Blocked", _why_blocked(policy), requeue)


def _wedged(olds: Sequence[RevisionState], old_plans: Sequence[RevisionPlan]) -> bool:
    """A superseded roll can wedge: two old revisions each hold a role's last pod, the update
    revision has none of that role and no room for one, and neither old revision can be un-routed
    without the other dropping below the floor. The update revision then gets one pod beyond
    maxSurge for that role: a brief extra GPU beats losing serving capacity."""
    return (
        sum(o.routed and not o.draining for o in olds) >= 2
        and not any(o.draining for o in olds)
        and all(p == unchanged(o) for p, o in zip(old_plans, olds, strict=True))
    )


def _held(
    update: RevisionState,
    olds: Sequence[RevisionState],
    hold: _Hold,
    goal: Mapping[EngineRole, int],
) -> bool:
    """The canary's goal (its share, or what the floor needs of it) serves and the anchor is
    down to what it keeps; nothing else is left."""
    anchor = next(o for o in olds if o.revision == hold.anchor)
    return (
        len(olds) == 1
        and update.serving
        and all(update.role(r).ready == update.role(r).pods == goal[r] for r in ENGINE_ROLES)
        and all(
            anchor.role(r).pods == anchor.role(r).replicas == hold.keep[r] for r in ENGINE_ROLES
        )
    )


def _complete(update: RevisionState, olds: Sequence[RevisionState], target: Target) -> bool:
    return (
        not olds
        and all(update.role(r).replicas == target.replicas(r) for r in ENGINE_ROLES)
        and all(update.role(r).ready == target.replicas(r) for r in ENGINE_ROLES)
        and all(update.role(r).pods == target.replicas(r) for r in ENGINE_ROLES)
        # A router restarting for new engine membership is no rollout: ready is enough.
        and update.router.ready >= target.router
    )


def _moves(plans: Sequence[RevisionPlan], observed: Sequence[RevisionState]) -> bool:
    """The step changes replicas, a drain mark or a deletion (an empty new revision is none)."""
    before = {s.revision: unchanged(s) for s in observed}
    return any(before.get(p.revision, RevisionPlan(p.revision, 0, 0, 0)) != p for p in plans)


def _under_way(update: RevisionState, olds: Sequence[RevisionState]) -> bool:
    """Something the planner waits for can still change by itself: pods starting, becoming
    ready or terminating, or a drain running out."""
    revisions = (update, *olds)
    return any(s.draining for s in olds) or not all(
        role.settled for s in revisions for role in (s.prefill, s.decode, s.router)
    )


def _why_blocked(policy: Policy) -> str:
    if policy.verifying:
        return "the old revision keeps its last pods until the new revision is Verified"
    if policy.max_surge == 0 and policy.max_unavailable == 0:
        return (
            "maxSurge and maxUnavailable are both 0: no pod may be added or removed; "
            "set spec.rollout.maxSurge to 1 (or maxUnavailable, where capacity allows)"
        )
    return "no step can make progress with what is observed and the rollout policy"


def _step_old(
    old: RevisionState,
    available: dict[EngineRole, int],
    floor: dict[EngineRole, int],
    policy: Policy,
    now: float,
    may_unroute: bool,
    least: dict[EngineRole, int] | None = None,
) -> tuple[RevisionPlan, dict[EngineRole, int]]:
    """The plan for one old revision and the availability left after it; `least` (a canary's
    anchor) is what it keeps serving with: never un-routed, never below it."""
    keep = unchanged(old)
    if old.draining:
        # Invariant 4: pods stay until the drain ends and the router's pods are gone.
        return _drain(old, policy, now), available
    if not old.routed:
        # Never took traffic: nothing to drain, retire at once.
        return replace(keep, prefill=0, decode=0, router=0, delete=True), available

    without = {r: available[r] - reachable_ready([old], r) for r in ENGINE_ROLES}
    if least is None and may_unroute and all(without[r] >= floor[r] for r in ENGINE_ROLES):
        # Everything else carries the floor: stop routing here and start the drain. Its pods
        # are left alone in this step; they go when the drain ends.
        drain = math.ceil(now + policy.drain_seconds)
        return replace(keep, router=0, drain_until=drain), without

    left = dict(available)
    replicas: dict[EngineRole, int] = {}
    for r in ENGINE_ROLES:
        state = old.role(r)
        # Only what the reachable revisions hold beyond the floor may go, here too when this
        # revision is routed but unreachable for a moment (its router pod not Ready yet, or
        # failing a probe): its ready pods serve again once the router is back, and during a
        # roll that fails they are all the capacity there is.
        spare = max(left[r] - floor[r], 0)
        # Keep one pod of each role while the router may still send it traffic (invariant 4).
        kept = 1 if least is None else least[r]
        removable = min(spare, max(state.ready - kept, 0))
        replicas[r] = max(kept, min(state.replicas, state.ready - removable))
        left[r] -= removable
    return replace(keep, prefill=replicas["prefill"], decode=replicas["decode"]), left

"""The rollout planner, tested by simulating whole rollouts and checking every invariant at every
moment (`pdmtp.core.rollout.invariants`), over many shapes and policies, pods turning ready in
random order, rollouts superseded mid-way, and an operator that plans again right after its own
write, before the Deployment controller acts on it (`lag`)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pdmtp.core.revision_state import RevisionState, RoleState
from pdmtp.core.rollout import planner
from pdmtp.core.rollout.invariants import InvariantMonitor
from pdmtp.core.rollout.planner import Policy, Target, plan
from pdmtp.tools.simulate import InvariantViolation, SimCluster, Trace, simulate_rollout
from rollout_strategies import policies, replicas, targets

MAX_TICKS = 3000


def assert_only(sim: SimCluster, revision: str) -> None:
    left = {s.revision for s in sim.observe()}
    assert left == {revision}, f"revisions left behind: {left}"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    start=targets("aaaa"),
    target=targets("bbbb"),
    policy=policies,
    seed=st.integers(0, 2**32),
    ready_chance=st.sampled_from([0.1, 0.5, 1.0]),
    lag=st.booleans(),
)
def test_every_rollout_completes_holding_the_invariants(
    start: Target, target: Target, policy: Policy, seed: int, ready_chance: float, lag: bool
) -> None:
    sim = SimCluster.serving("aaaa", start, controller_lag=lag)
    trace = simulate_rollout(
        sim,
        InvariantMonitor(policy),
        target,
        random.Random(seed),
        max_ticks=MAX_TICKS,
        ready_chance=ready_chance,
    )
    assert trace.complete, f"no completion in {MAX_TICKS} ticks"
    assert_only(sim, "bbbb")
    assert not [s for _, _, s in trace.steps if s.blocked], "a reachable roll reported Blocked"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    a=targets("aaaa"),
    b=targets("bbbb"),
    c=targets("cccc"),
    policy=policies,
    seed=st.integers(0, 2**32),
    b_ticks=st.integers(0, 12),
    lag=st.booleans(),
    down=st.tuples(st.integers(0, 30), st.integers(0, 3)),
)
def test_superseded_rollouts_complete_to_the_last_target(
    a: Target,
    b: Target,
    c: Target,
    policy: Policy,
    seed: int,
    b_ticks: int,
    lag: bool,
    down: tuple[int, int],
) -> None:
    """`down`: the operator is down for a few ticks (killed, restarted) from some tick of the
    B -> C roll."""
    rng = random.Random(seed)
    sim = SimCluster.serving("aaaa", a, controller_lag=lag)
    monitor = InvariantMonitor(policy)
    simulate_rollout(sim, monitor, b, rng, max_ticks=b_ticks)
    trace = simulate_rollout(sim, monitor, c, rng, max_ticks=MAX_TICKS, outages=dict([down]))
    assert trace.complete
    assert_only(sim, "cccc")
    assert not [s for _, _, s in trace.steps if s.blocked]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    a=targets("aaaa"),
    b=targets("bbbb"),
    policy=policies,
    seed=st.integers(0, 2**32),
    delay=st.integers(1, 8),
    down=st.tuples(st.integers(0, 40), st.integers(0, 6)),
)
def test_a_drain_counts_from_when_the_router_stopped_serving_not_from_the_last_look(
    a: Target, b: Target, policy: Policy, seed: int, delay: int, down: tuple[int, int]
) -> None:
    """A slow Deployment controller (after a control-plane outage) removes a router scaled to
    zero `delay` ticks later, between two of the operator's looks, maybe while the operator is
    down: the old revision's pods still stay drainSeconds after that (invariant 4, checked with
    no tolerance), the drain's end read back from what the operator recorded (issue 52)."""
    sim = SimCluster.serving("aaaa", a, router_delay=delay)
    trace = simulate_rollout(
        sim,
        InvariantMonitor(policy),
        b,
        random.Random(seed),
        max_ticks=MAX_TICKS,
        outages=dict([down]),
    )
    assert trace.complete
    assert_only(sim, "bbbb")


def test_a_router_that_outlives_its_scale_down_delays_the_drain_by_as_much() -> None:
    """The case of the cluster tier's outage test, step by step: the router is turned off at t,
    its pod serves until t + 5, and the old revision's pods go at t + 5 + drainSeconds."""
    policy = Policy(max_surge=1, max_unavailable=0, drain_seconds=4)
    a, b = Target("aaaa", 1, 1, 1), Target("bbbb", 1, 1, 1)
    sim = SimCluster.serving("aaaa", a, router_delay=5)
    trace = simulate_rollout(
        sim, InvariantMonitor(policy), b, random.Random(1), max_ticks=200, ready_chance=1
    )
    assert trace.complete
    unrouted = next(t for t, _, s in trace.steps if (p := s.for_revision("aaaa")) and p.router == 0)
    stopped = next(
        t
        for t, observed, _ in trace.steps
        if any(o.revision == "aaaa" and o.draining and not o.serving for o in observed)
    )
    retired = next(t for t, _, s in trace.steps if (p := s.for_revision("aaaa")) and p.delete)
    assert stopped - unrouted >= 5
    assert retired - stopped >= policy.drain_seconds


@settings(max_examples=100, deadline=None)
@given(
    a=targets("aaaa"),
    b=targets("bbbb"),
    policy=policies,
    seed=st.integers(0, 2**32),
    back_after=st.integers(0, 10),
    lag=st.booleans(),
)
def test_rolling_back_mid_way_returns_to_the_old_revision(
    a: Target, b: Target, policy: Policy, seed: int, back_after: int, lag: bool
) -> None:
    rng = random.Random(seed)
    sim = SimCluster.serving("aaaa", a, controller_lag=lag)
    monitor = InvariantMonitor(policy)
    simulate_rollout(sim, monitor, b, rng, max_ticks=back_after)
    assert simulate_rollout(sim, monitor, a, rng, max_ticks=MAX_TICKS).complete
    assert_only(sim, "aaaa")


@settings(max_examples=150, deadline=None)
@given(
    a=targets("aaaa"),
    b=targets("bbbb"),
    policy=policies,
    seed=st.integers(0, 2**32),
    ticks=st.integers(0, 30),
)
def test_planning_is_idempotent_on_an_unchanged_observation(
    a: Target, b: Target, policy: Policy, seed: int, ticks: int
) -> None:
    """Stateless (invariant 6): re-planning what was just applied, before any pod moves, asks
    for nothing new, so an operator restarted right after a write does not flip-flop."""
    rng = random.Random(seed)
    sim = SimCluster.serving("aaaa", a)
    simulate_rollout(sim, InvariantMonitor(policy), b, rng, max_ticks=ticks)
    first = plan(sim.observe(), b, policy, sim.now)
    sim.apply(first)
    second = plan(sim.observe(), b, policy, sim.now)
    for p in first.revisions:
        again = second.for_revision(p.revision)
        if p.delete:
            continue
        assert again is not None
        assert (again.prefill, again.decode, again.router) == (p.prefill, p.decode, p.router)
        assert again.drain_until == p.drain_until


def test_an_incompatible_target_changes_nothing() -> None:
    observed = [
        RevisionState("aaaa", RoleState(2, 2, 2), RoleState(3, 3, 3), RoleState(1, 1, 1)),
        RevisionState(
            "bbbb", RoleState(1, 1, 0), RoleState(1, 1, 0), RoleState(0, 0, 0), created=5.0
        ),
    ]
    step = plan(observed, Target(None, 4, 4, 1), Policy(1, 0, 10), now=10.0)
    assert step.outcome == "Blocked" and "incompatible" in step.reason
    for state, p in zip(observed, step.revisions, strict=True):
        assert (p.prefill, p.decode, p.router, p.delete) == (
            state.prefill.replicas,
            state.decode.replicas,
            state.router.replicas,
            False,
        )


def test_create_from_nothing_routes_only_once_both_roles_are_ready() -> None:
    target, policy = Target("aaaa", 2, 3, 1), Policy(1, 0, 0)
    step = plan([], target, policy, now=0)
    (p,) = step.revisions
    assert (p.prefill, p.decode, p.router) == (2, 3, 0)
    prefill_only = RevisionState("aaaa", RoleState(2, 2, 2), RoleState(3, 3, 0))
    assert plan([prefill_only], target, policy, 1).revisions[0].router == 0
    both = replace(prefill_only, decode=RoleState(3, 3, 1))
    assert plan([both], target, policy, 2).revisions[0].router == 1


def test_drain_holds_pods_until_the_deadline_then_retires() -> None:
    policy = Policy(1, 0, 30)
    old = RevisionState(
        "aaaa",
        RoleState(1, 1, 1),
        RoleState(1, 1, 1),
        RoleState(0, 0, 0),
        drain_until=130.0,
        traffic_stopped=100.0,
    )
    new = RevisionState(
        "bbbb", RoleState(1, 1, 1), RoleState(1, 1, 1), RoleState(1, 1, 1), created=100.0
    )
    target = Target("bbbb", 1, 1, 1)
    early = plan([old, new], target, policy, now=129.0)
    assert early.for_revision("aaaa") == planner.RevisionPlan("aaaa", 1, 1, 0, 130.0, 100.0)
    assert early.requeue_after == pytest.approx(1.0)
    late = plan([old, new], target, policy, now=130.0)
    retired = late.for_revision("aaaa")
    assert retired is not None and retired.delete


def test_a_drain_whose_stop_was_never_recorded_starts_counting_when_it_is_seen() -> None:
    """Un-routed by an operator that went away (or by a release before the stop was recorded)
    before anyone saw the router stop serving: the drain's end may be past, yet the pods stay
    drainSeconds from now, and the moment is recorded (rounded up, as the annotation holds whole
    seconds)."""
    policy = Policy(1, 0, 30)
    old = RevisionState(
        "aaaa", RoleState(1, 1, 1), RoleState(1, 1, 1), RoleState(0, 0, 0), drain_until=130.0
    )
    new = RevisionState(
        "bbbb", RoleState(1, 1, 1), RoleState(1, 1, 1), RoleState(1, 1, 1), created=100.0
    )
    step = plan([old, new], Target("bbbb", 1, 1, 1), policy, now=200.4)
    assert step.for_revision("aaaa") == planner.RevisionPlan("aaaa", 1, 1, 0, 231, 201)
    assert step.requeue_after == pytest.approx(30.6)
    still_serving = replace(old, router=RoleState(0, 1, 1))
    step = plan([still_serving, new], Target("bbbb", 1, 1, 1), policy, now=200.4)
    assert step.for_revision("aaaa") == planner.RevisionPlan("aaaa", 1, 1, 0, 231, None)


def test_a_broken_planner_is_caught_by_the_monitor(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks can fail: a planner that retires old revisions without draining them."""
    real_step_old = planner._step_old

    def hasty(old: RevisionState, *args: object, **kwargs: object) -> object:
        plan_, left = real_step_old(old, *args, **kwargs)  # type: ignore[arg-type]
        if plan_.drain_until is not None:
            plan_ = replace(plan_, delete=True)
        return plan_, left

    monkeypatch.setattr(planner, "_step_old", hasty)
    start, policy = Target("aaaa", 2, 2, 1), Policy(1, 0, 5)
    with pytest.raises(InvariantViolation, match="invariant 4"):
        simulate_rollout(
            SimCluster.serving("aaaa", start),
            InvariantMonitor(policy),
            Target("bbbb", 2, 2, 1),
            random.Random(1),
        )


def test_a_planner_that_ignores_surge_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    real_plan = planner.plan

    def greedy(observed, target, policy, now):  # type: ignore[no-untyped-def]
        step = real_plan(observed, target, policy, now)
        bumped = tuple(
            replace(p, prefill=target.prefill, decode=target.decode)
            if p.revision == target.revision
            else p
            for p in step.revisions
        )
        return replace(step, revisions=bumped)

    monkeypatch.setattr("pdmtp.tools.simulate.plan", greedy)
    start, policy = Target("aaaa", 3, 3, 1), Policy(1, 0, 0)
    with pytest.raises(InvariantViolation, match="invariant 3"):
        simulate_rollout(
            SimCluster.serving("aaaa", start),
            InvariantMonitor(policy),
            Target("bbbb", 3, 3, 1),
            random.Random(1),
        )


def test_trace_of_a_simple_roll() -> None:
    start, policy = Target("aaaa", 1, 1, 1), Policy(1, 0, 2)
    trace = Trace()
    sim = SimCluster.serving("aaaa", start)
    simulate_rollout(
        sim,
        InvariantMonitor(policy),
        Target("bbbb", 1, 1, 1),
        random.Random(0),
        ready_chance=1.0,
        trace=trace,
    )
    assert trace.complete
    # create, ready+route, unroute, drain 2s, retire, complete: a handful of steps.
    assert 5 <= len(trace.steps) <= 10


def test_a_policy_that_allows_no_move_is_blocked_not_waiting() -> None:
    serving = RevisionState("aaaa", RoleState(2, 2, 2), RoleState(2, 2, 2), RoleState(1, 1, 1))
    step = plan([serving], Target("bbbb", 2, 2, 1), Policy(0, 0, 10), now=10.0)
    assert step.revisions[-1] == planner.RevisionPlan("bbbb", 0, 0, 0)
    assert step.outcome == "Blocked"
    assert "maxSurge and maxUnavailable are both 0" in step.reason


def test_waiting_for_pods_is_progress_not_blocked() -> None:
    old = RevisionState("aaaa", RoleState(1, 1, 1), RoleState(1, 1, 1), RoleState(1, 1, 1))
    starting = RevisionState(
        "bbbb", RoleState(1, 1, 0), RoleState(1, 1, 0), RoleState(0, 0, 0), created=5.0
    )
    step = plan([old, starting], Target("bbbb", 1, 1, 1), Policy(1, 0, 10), now=10.0)
    assert step.outcome == "Progress"
    before = (old, starting)
    assert all(p == planner.unchanged(s) for p, s in zip(step.revisions, before, strict=True))


# ---- rollout control: pause, canary, rollback, scaling mid-roll, a full cluster -------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    a=targets("aaaa"),
    b=targets("bbbb"),
    policy=policies,
    seed=st.integers(0, 2**32),
    pause_at=st.integers(0, 20),
    paused_for=st.integers(1, 15),
    lag=st.booleans(),
)
def test_pause_at_any_step_freezes_then_resume_completes(
    a: Target, b: Target, policy: Policy, seed: int, pause_at: int, paused_for: int, lag: bool
) -> None:
    rng = random.Random(seed)
    sim = SimCluster.serving("aaaa", a, controller_lag=lag)
    monitor = InvariantMonitor(policy)
    if simulate_rollout(sim, monitor, b, rng, max_ticks=pause_at).complete:
        return
    frozen = replace(policy, paused=True)
    trace = simulate_rollout(sim, monitor, b, rng, policy=frozen, max_ticks=paused_for)
    for _, observed, step in trace.steps:
        assert step.outcome == "Paused"
        before = {s.revision: planner.unchanged(s) for s in observed}
        for p in step.revisions:
            # Only a drain acts: it records when its traffic stopped (its end moves with that),
            # and its revision retires once it ran out.
            was = before[p.revision]
            recorded = was.traffic_stopped is None and p.traffic_stopped is not None
            marks = {"drain_until": was.drain_until, "traffic_stopped": was.traffic_stopped}
            assert p == was or p.delete or (recorded and replace(p, **marks) == was), (p, was)
    assert simulate_rollout(sim, monitor, b, rng, max_ticks=MAX_TICKS).complete
    assert_only(sim, "bbbb")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    a=targets("aaaa"),
    b=targets("bbbb"),
    policy=policies,
    seed=st.integers(0, 2**32),
    percent=st.integers(1, 99),
    lag=st.booleans(),
)
def test_a_canary_holds_at_its_share_then_promotion_completes(
    a: Target, b: Target, policy: Policy, seed: int, percent: int, lag: bool
) -> None:
    rng = random.Random(seed)
    sim = SimCluster.serving("aaaa", a, controller_lag=lag)
    monitor = InvariantMonitor(policy)
    canary = replace(policy, canary_percent=percent)
    held = simulate_rollout(
        sim, monitor, b, rng, policy=canary, until=lambda s: s.outcome == "Held"
    )
    share = planner.canary_replicas(b, percent)
    keep = {
        r: min(max(1, b.replicas(r) - share[r]), b.replicas(r) + policy.max_surge - share[r])
        for r in ("prefill", "decode")
    }
    if min(keep.values()) < 1 or held.complete:
        return  # no room for both revisions: a plain rollout (it completed)
    last = held.steps[-1][2]
    assert last.outcome == "Held", "the canary never reached its hold"
    states = {s.revision: s for s in sim.observe()}
    assert set(states) == {"aaaa", "bbbb"}
    for r in ("prefill", "decode"):
        assert states["bbbb"].role(r).ready == share[r]  # type: ignore[arg-type]
        assert states["aaaa"].role(r).pods <= a.replicas(r)  # type: ignore[arg-type]
    assert states["aaaa"].serving and states["bbbb"].serving
    # Held means held: more ticks change nothing.
    again = simulate_rollout(sim, monitor, b, rng, policy=canary, max_ticks=5)
    assert all(step.outcome == "Held" for _, _, step in again.steps)
    # Promotion: the canary leaves the policy and the rollout completes.
    assert simulate_rollout(sim, monitor, b, rng, max_ticks=MAX_TICKS).complete
    assert_only(sim, "bbbb")


def test_canary_routers_realise_the_share() -> None:
    assert planner.canary_routers(1, 25) == (1, 3)  # 1 of 4 endpoints: 25%
    assert planner.canary_routers(1, 50) == (1, 1)
    assert planner.canary_routers(2, 10) == (2, 18)
    assert planner.canary_routers(1, 75) == (3, 1)  # the canary's routers grow above 50%
    assert planner.canary_routers(2, 90) == (18, 2)
    assert planner.canary_routers(1, 1) == (1, planner.MAX_CANARY_ROUTERS)
    for routers in range(1, 4):
        for percent in range(1, 100):
            mine, theirs = planner.canary_routers(routers, percent)
            share = 100 * mine / (mine + theirs)
            capped = planner.MAX_CANARY_ROUTERS in (mine, theirs)
            assert capped or abs(share - percent) <= 100 / (mine + theirs), (routers, percent)
    assert planner.canary_replicas(Target("b", 8, 3, 1), 25) == {"prefill": 2, "decode": 1}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    a=targets("aaaa"),
    b=targets("bbbb"),
    policy=policies,
    seed=st.integers(0, 2**32),
    fail_after=st.integers(0, 25),
    lag=st.booleans(),
)
def test_rollback_of_a_failing_revision_from_any_state_keeps_the_old_floor(
    a: Target, b: Target, policy: Policy, seed: int, fail_after: int, lag: bool
) -> None:
    """The new revision's engines never get ready (they refuse their config); the roll is
    rolled back at any tick: the old revision returns to its target, never below its floor."""
    rng = random.Random(seed)
    sim = SimCluster.serving("aaaa", a, failing={"bbbb"}, controller_lag=lag)
    monitor = InvariantMonitor(policy)
    simulate_rollout(sim, monitor, b, rng, max_ticks=fail_after)
    rollback = replace(a, prefill=b.prefill, decode=b.decode, router=b.router)
    trace = simulate_rollout(sim, monitor, rollback, rng, max_ticks=MAX_TICKS)
    assert trace.complete
    assert_only(sim, "aaaa")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    a=targets("aaaa"),
    b=targets("bbbb"),
    policy=policies,
    seed=st.integers(0, 2**32),
    at=st.integers(0, 25),
    prefill=replicas,
    decode=replicas,
    lag=st.booleans(),
)
def test_scaling_mid_roll_is_honoured_without_restarting_it(
    a: Target, b: Target, policy: Policy, seed: int, at: int, prefill: int, decode: int, lag: bool
) -> None:
    rng = random.Random(seed)
    sim = SimCluster.serving("aaaa", a, controller_lag=lag)
    monitor = InvariantMonitor(policy)
    if simulate_rollout(sim, monitor, b, rng, max_ticks=at).complete:
        return
    created = {s.revision: s.created for s in sim.observe()}
    scaled = replace(b, prefill=prefill, decode=decode)
    assert simulate_rollout(sim, monitor, scaled, rng, max_ticks=MAX_TICKS).complete
    assert_only(sim, "bbbb")
    final = sim.observe()[0]
    assert (final.prefill.replicas, final.decode.replicas) == (prefill, decode)
    if "bbbb" in created:
        assert final.created == created["bbbb"], "the roll restarted (a new revision object)"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=targets("aaaa"), seed=st.integers(0, 2**32), drain=st.integers(0, 5))
def test_a_full_cluster_rolls_pair_by_pair_with_max_surge_zero(
    a: Target, seed: int, drain: int
) -> None:
    """Every GPU taken: no pod beyond the target can be scheduled. maxSurge 0, maxUnavailable 1
    completes (one-replica roles included); maxSurge 1, maxUnavailable 0 waits forever."""
    capacity = {"prefill": a.prefill, "decode": a.decode}
    b = replace(a, revision="bbbb")
    rng = random.Random(seed)
    sim = SimCluster.serving("aaaa", a, capacity=capacity)
    assert simulate_rollout(
        sim, InvariantMonitor(Policy(0, 1, drain)), b, rng, max_ticks=MAX_TICKS
    ).complete
    assert_only(sim, "bbbb")

    sim = SimCluster.serving("aaaa", a, capacity=capacity)
    stuck = simulate_rollout(sim, InvariantMonitor(Policy(1, 0, drain)), b, rng, max_ticks=200)
    assert not stuck.complete
    states = {s.revision: s for s in sim.observe()}
    assert states["aaaa"].serving
    assert states["aaaa"].prefill.ready == a.prefill and states["aaaa"].decode.ready == a.decode

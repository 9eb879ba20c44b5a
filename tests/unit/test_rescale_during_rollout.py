"""Scaling during a paired rollout (issue 22): the replicas change at every step of a roll.

A paired rollout (a new compat revision: prefill and decode roll together) from `aaaa` to `bbbb`
is simulated once, unscaled, and copied before each of its planner steps; then, for every step
index (the last one: the step that finds it complete), the copy taken there goes on with the
target's replicas changed right before that planner step. Changes go up and down, to one replica
and to more, for each role alone and for both (in the same or opposite directions), and a scale-up
right after a scale-down, under several maxSurge/maxUnavailable policies, with and without a
canary (promoted as soon as it holds). A second test changes the replicas at every single tick
of the first stretch of the roll (hypothesis).

Checked at every simulated moment (after each planner step and after each second of pods):

- every rollout invariant (`InvariantMonitor`, bounds moved to the new target by `rescale`,
  which keeps the roll's anchor: a replica change is not a new roll);
- pods per role (terminating ones included) never grow while above the new target + maxSurge:
  `pods(t) <= max(target + maxSurge, pods(t - 1))`. This is the exact ceiling the planner
  promises after a scale-down mid-roll: pods cannot vanish faster than they drain and
  terminate, so right after the change the count may stand above the new ceiling; the planner
  never adds one there, and once at or under the new ceiling the count stays there. (The
  monitor's own bound is looser, the pods there were when the target changed; and a superseded
  roll's wedge, one pod more, cannot occur with two revisions.)
- a revision that served a moment ago still has a ready prefill and a ready decode (a
  scale-down never takes the last ready pod of a serving revision);
- the roll is not restarted: the new revision stays the same object, its ready pods are removed
  only down to its goal (the target, or the canary share), and the pods that were ready when the
  replicas changed are still there at the end (up to the new count);
- the planner never plans the new revision above the target, never grows an old revision, and
  never reports Blocked.

And at the end: the roll completes, `bbbb` alone, at the new counts, every pod ready.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pdmtp.api.vocabulary import ENGINE_ROLES, EngineRole
from pdmtp.core.revision_state import RevisionState, RoleState
from pdmtp.core.rollout.invariants import InvariantMonitor
from pdmtp.core.rollout.planner import Policy, Step, Target, canary_replicas, plan
from pdmtp.core.rollout.removal import gate
from pdmtp.tools.simulate import InvariantViolation, SimCluster, SimPod, SimRevision

START = Target("aaaa", 3, 2, 1)
NEW = Target("bbbb", 3, 2, 1)
"""A paired rollout: the compat revision changes, the replicas do not (until scaled)."""
SEED = 7
READY_CHANCE = 0.6
TERMINATE_TICKS = 2
"""Terminating pods outlive the next planner step: they still hold GPUs, and count."""
MAX_TICKS = 400
CANARY = 50

POLICIES = [
    pytest.param(Policy(1, 0, 2), id="surge1-unavail0"),
    pytest.param(Policy(0, 1, 2), id="surge0-unavail1"),
    pytest.param(Policy(2, 1, 1), id="surge2-unavail1"),
    pytest.param(Policy(1, 2, 0), id="surge1-unavail2"),
]
CANARIES = [pytest.param(None, id="rolling"), pytest.param(CANARY, id=f"canary{CANARY}")]
CHANGES = [
    pytest.param(((5, 2),), id="prefill-up"),
    pytest.param(((1, 2),), id="prefill-to-1"),
    pytest.param(((3, 4),), id="decode-up"),
    pytest.param(((3, 1),), id="decode-to-1"),
    pytest.param(((1, 1),), id="both-to-1"),
    pytest.param(((6, 5),), id="both-up"),
    pytest.param(((5, 1),), id="prefill-up-decode-to-1"),
    pytest.param(((1, 4),), id="prefill-to-1-decode-up"),
    pytest.param(((1, 1), (1, 1), (5, 4)), id="both-to-1-then-up"),
    pytest.param(((6, 5), (1, 1), (1, 1), (6, 5)), id="both-up-to-1-up"),
]
"""The replicas (prefill, decode) asked for from a step on, one entry per planner step; the
last ones scale up right after a scale-down, while its pods still terminate."""

Counts = tuple[int, int]


def live(pods: list[SimPod]) -> list[SimPod]:
    return [p for p in pods if p.terminating_for is None]


@dataclass
class Watch:
    """The checks beyond the invariant monitor, fed the same moments."""

    sim: SimCluster
    monitor: InvariantMonitor
    policy: Policy
    canary: int | None
    target: Target
    pods: dict[EngineRole, int] = field(default_factory=dict)
    serving: set[str] = field(default_factory=set)
    ready_new: dict[EngineRole, int] = field(default_factory=dict)
    update: SimRevision | None = None
    kept: dict[EngineRole, set[str]] = field(default_factory=dict)
    """The new revision's pods that were ready when the replicas last changed."""
    keep: dict[EngineRole, int] = field(default_factory=dict)
    """How many of them must stay: the lowest goal since then."""

    @property
    def new(self) -> str:
        assert self.target.revision is not None
        return self.target.revision

    def goal(self, role: EngineRole) -> int:
        """What the new revision may keep of a role: its canary share while one holds."""
        if self.canary is None:
            return self.target.replicas(role)
        return canary_replicas(self.target, self.canary)[role]

    def rescale(self, target: Target) -> None:
        self.target = target
        self.monitor.rescale(self.sim.observe(), target)
        rev = self.sim.revisions.get(self.new)
        for role in ENGINE_ROLES:
            ready = [p.name for p in live(rev.workloads[role].pods) if p.ready] if rev else []
            self.kept[role] = set(ready)
            self.keep[role] = self.goal(role)

    def moment(self, label: str) -> None:
        moment = self.sim.moment(label)
        if violations := self.monitor.check(moment):
            raise InvariantViolation(violations[0])
        where = f"at t={self.sim.now:.0f} ({label})"
        states = {s.revision: s for s in moment.states}
        for role in ENGINE_ROLES:
            pods = sum(s.role(role).pods for s in states.values())
            ceiling = self.target.replicas(role) + self.policy.max_surge
            before = self.pods.get(role, pods)
            assert pods <= max(ceiling, before), (
                f"{where}: {pods} {role} pods, more than max({ceiling}, {before} a moment ago)"
            )
            self.pods[role] = pods
        for revision in self.serving:
            state = states.get(revision)
            assert state is not None and min(state.prefill.ready, state.decode.ready) >= 1, (
                f"{where}: {revision} served a moment ago and lost its last ready pod of a role"
            )
        self.serving = {s.revision for s in states.values() if s.serving}
        self._progress_kept(where)

    def _progress_kept(self, where: str) -> None:
        rev = self.sim.revisions.get(self.new)
        if rev is None:
            return
        if self.update is None:
            self.update = rev
        assert rev is self.update and not rev.deleted, (
            f"{where}: the new revision was deleted or recreated"
        )
        for role in ENGINE_ROLES:
            # Ready pods (leaving-marked ones too) go only down to the goal.
            ready = sum(p.ready for p in live(rev.workloads[role].pods))
            before = self.ready_new.get(role, 0)
            assert ready >= min(before, self.goal(role)), (
                f"{where}: the new revision's ready {role} pods fell from {before} to {ready}, "
                f"below its goal {self.goal(role)}"
            )
            self.ready_new[role] = ready
            self.keep[role] = min(self.keep.get(role, ready), self.goal(role))

    def step(self, observed: list[RevisionState], step: Step) -> None:
        where = f"at t={self.sim.now:.0f}"
        assert not step.blocked, f"{where}: Blocked: {step.reason}"
        before = {s.revision: s for s in observed}
        for p in step.revisions:
            for role in ENGINE_ROLES:
                if p.revision == self.target.revision:
                    assert p.replicas(role) <= self.target.replicas(role), (
                        f"{where}: the new revision planned above the target: {p}"
                    )
                elif p.revision in before:
                    assert p.replicas(role) <= before[p.revision].role(role).replicas, (
                        f"{where}: an old revision grew: {p}"
                    )


@dataclass
class Roll:
    """The paired rollout `START -> NEW` in progress, driven as the reconcile drives it (the
    planner, then the removal gate) and checked at every moment. A canary is promoted as soon as
    it holds. Copied whole (`copy.deepcopy`) to branch a scaled roll off the unscaled one."""

    sim: SimCluster
    watch: Watch
    rng: random.Random
    tick: int = 0
    held: int | None = None
    """The tick the canary held at (None: it never did)."""

    @classmethod
    def start(
        cls, policy: Policy, canary: int | None, start: Target = START, new: Target = NEW
    ) -> Roll:
        sim = SimCluster.serving(start.revision or "", start)
        sim.terminate_ticks = TERMINATE_TICKS
        monitor = InvariantMonitor(policy)
        monitor.retarget(sim.observe(), new)
        watch = Watch(sim, monitor, policy, canary, new)
        watch.moment("start")
        return cls(sim, watch, random.Random(SEED))

    def step(self, counts: Counts | None = None) -> bool:
        """One planner step (the replicas changed to `counts` first) and one second of pods;
        True, with nothing applied, when the planner reports the roll complete."""
        sim, watch = self.sim, self.watch
        if counts is not None and counts != (watch.target.prefill, watch.target.decode):
            watch.rescale(replace(watch.target, prefill=counts[0], decode=counts[1]))
        observed = sim.observe()
        policy = replace(watch.policy, canary_percent=watch.canary)
        step = plan(observed, watch.target, policy, sim.now)
        watch.step(observed, step)
        if step.complete:
            return True
        if step.outcome == "Held":
            self.held, watch.canary = self.tick, None  # promoted: the next step rolls on
        sim.apply(step, gate(step.revisions, observed, sim.engines(), sim.routers()))
        watch.moment("after the planner's step")
        sim.advance(self.rng, READY_CHANCE)
        watch.moment("after pods changed")
        self.tick += 1
        return False

    def finish(self) -> Roll:
        while not self.step():
            assert self.tick < MAX_TICKS, f"no completion in {MAX_TICKS} ticks"
        return self


def assert_done_at(roll: Roll, counts: Counts) -> None:
    states = roll.sim.observe()
    assert [s.revision for s in states] == [roll.watch.new], f"left behind: {states}"
    (final,) = states
    for role, n in zip(ENGINE_ROLES, counts, strict=True):
        state = final.role(role)
        assert state.replicas == state.pods == state.ready == n, (role, state)
        names = {p.name for p in live(roll.sim.revisions[roll.watch.new].workloads[role].pods)}
        kept = roll.watch.kept.get(role, set())
        assert len(kept & names) >= min(len(kept), roll.watch.keep[role]), (
            f"{role}: pods ready when the replicas changed were replaced: {kept - names}"
        )


def scaled_at(policy: Policy, at: int, counts: Counts) -> Roll:
    roll = Roll.start(policy, None)
    for _ in range(at):
        roll.step()
    roll.step(counts)
    return roll.finish()


_baselines: dict[tuple[Policy, int | None], tuple[Roll, list[Roll]]] = {}


def baseline(policy: Policy, canary: int | None) -> tuple[Roll, list[Roll]]:
    """The unscaled roll, complete, and a copy of it before each of its planner steps (the
    step indices to scale at)."""
    key = (policy, canary)
    if key not in _baselines:
        roll, before = Roll.start(policy, canary), []
        while True:
            before.append(copy.deepcopy(roll))
            if roll.step():
                break
        assert canary is None or roll.held is not None, "the canary never held"
        assert_done_at(roll, (NEW.prefill, NEW.decode))
        _baselines[key] = roll, before
    return _baselines[key]


@pytest.mark.parametrize("changes", CHANGES)
@pytest.mark.parametrize("canary", CANARIES)
@pytest.mark.parametrize("policy", POLICIES)
def test_scaling_at_every_step_of_a_paired_roll(
    policy: Policy, canary: int | None, changes: tuple[Counts, ...]
) -> None:
    unscaled, before = baseline(policy, canary)
    assert len(before) >= 5, "a paired roll takes several steps"
    for at, snapshot in enumerate(before):
        roll = copy.deepcopy(snapshot)
        for counts in changes:
            roll.step(counts)
        assert_done_at(roll.finish(), changes[-1])
        if unscaled.held is not None and at <= unscaled.held:
            # Scaled before the promotion: the canary holds at its new share, unless some
            # counts left no room for both revisions (it degenerates to a plain roll).
            assert roll.held is not None or not all(room(policy, c) for c in changes), at


def room(policy: Policy, counts: Counts) -> bool:
    """A canary at these counts has room for both revisions (`planner._hold`)."""
    scaled = replace(NEW, prefill=counts[0], decode=counts[1])
    share = canary_replicas(scaled, CANARY)
    return all(scaled.replicas(r) + policy.max_surge - share[r] >= 1 for r in ENGINE_ROLES)


@settings(max_examples=60, deadline=None)
@given(
    policy=st.sampled_from([p.values[0] for p in POLICIES]),
    canary=st.sampled_from([None, CANARY]),
    walk=st.lists(st.tuples(st.integers(1, 6), st.integers(1, 6)), min_size=1, max_size=40),
)
def test_replicas_changed_at_every_tick(
    policy: Policy, canary: int | None, walk: list[Counts]
) -> None:
    """A new count at every tick of the first stretch of the roll, then the last one stays."""
    roll = Roll.start(policy, canary)
    for counts in walk:
        roll.step(counts)  # after completion too: the same revision scaled
    assert_done_at(roll.finish(), walk[-1])


def test_a_scale_up_right_after_a_scale_down_waits_for_the_terminating_pods() -> None:
    """Found by the every-tick walk (decode 2 -> 3 -> 1 -> 3, maxSurge 1): the new revision's
    own terminating pods hold GPUs as an old revision's do. Before the fix the planner counted
    only the old revisions' pods against target + maxSurge, and asked for 2 decode here: 2 of
    `aaaa` + 2 live and 1 terminating of `bbbb` = 5 decode pods, over the ceiling of 4."""
    observed = [
        RevisionState("aaaa", RoleState(3, 3, 1), RoleState(2, 2, 1), RoleState(1, 1, 1)),
        RevisionState("bbbb", decode=RoleState(1, 2, 1), created=0.0),
    ]
    step = plan(observed, Target("bbbb", 1, 3, 1), Policy(1, 0, 2), now=2.0)
    new = step.for_revision("bbbb")
    assert new is not None and new.decode == 1
    assert step.outcome == "Progress"


def test_a_canary_scaled_down_keeps_what_the_floor_needs_of_it() -> None:
    """Found by the every-tick walk (canary 50%, maxSurge 1, maxUnavailable 0; prefill 1 -> 5 ->
    4 while held): the anchor kept 1 prefill (it never grows) and the canary 3 (its share of 5).
    At 4 the share is 2, and before the fix the planner cut the canary to it: 3 ready prefill
    pods, under the floor of 4. The canary now keeps the 3 the floor needs, and holds there."""
    observed = [
        RevisionState("aaaa", RoleState(1, 1, 1), RoleState(1, 1, 1), RoleState(1, 1, 1)),
        RevisionState(
            "bbbb", RoleState(3, 3, 3), RoleState(1, 1, 1), RoleState(1, 1, 1), created=1.0
        ),
    ]
    policy = Policy(1, 0, 2, canary_percent=50)
    step = plan(observed, Target("bbbb", 4, 1, 1), policy, now=9.0)
    new = step.for_revision("bbbb")
    assert new is not None and (new.prefill, new.decode) == (3, 1)
    assert step.outcome == "Held"


def test_the_ceiling_check_catches_a_planner_that_keeps_the_old_ceiling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The checks can fail: a planner that, after a scale-down of both roles by one, still allows
    the old target + maxSurge pods stays under the monitor's bound (the pods there were when the
    change came) but adds a pod above the new ceiling once one has gone: the ratchet sees it."""
    real_plan = plan

    def stale(observed: list[RevisionState], target: Target, policy: Policy, now: float) -> Step:
        surge = policy.max_surge + (target != NEW)
        return real_plan(observed, target, replace(policy, max_surge=surge), now)

    monkeypatch.setattr(f"{__name__}.plan", stale)
    with pytest.raises(AssertionError, match=r"pods, more than max\("):
        scaled_at(Policy(1, 0, 2), 2, (2, 1))


def test_the_progress_check_catches_a_restarted_roll(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks can fail: a planner that, once the new revision has a ready prefill (before it
    serves, so no invariant is at stake), deletes it and starts it over."""
    real_plan = plan
    restarted: list[bool] = []

    def restart(observed: list[RevisionState], target: Target, policy: Policy, now: float) -> Step:
        step = real_plan(observed, target, policy, now)
        new = next((s for s in observed if s.revision == "bbbb"), None)
        if restarted or new is None or new.prefill.ready < 1 or new.serving:
            return step
        restarted.append(True)
        gone = tuple(
            replace(p, prefill=0, decode=0, router=0, delete=True) if p.revision == "bbbb" else p
            for p in step.revisions
        )
        return replace(step, revisions=gone)

    monkeypatch.setattr(f"{__name__}.plan", restart)
    with pytest.raises(AssertionError, match="the new revision was deleted or recreated"):
        scaled_at(Policy(1, 0, 2), 1, (5, 2))


def test_a_scale_down_that_takes_the_last_ready_pod_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The checks can fail: a planner that drops the serving revision's pods to zero."""
    real_plan = plan

    def hasty(observed: list[RevisionState], target: Target, policy: Policy, now: float) -> Step:
        step = real_plan(observed, target, policy, now)
        cut = tuple(
            replace(p, prefill=0) if p.revision == "aaaa" and not p.delete else p
            for p in step.revisions
        )
        return replace(step, revisions=cut)

    monkeypatch.setattr(f"{__name__}.plan", hasty)
    with pytest.raises(AssertionError, match=r"invariant 2|last ready"):
        scaled_at(Policy(1, 0, 2), 1, (1, 1))

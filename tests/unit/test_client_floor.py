"""The floor as clients see it (issue 31, item 5): invariant 3 counts only the pods a client can
reach, Ready and not leaving, in a revision whose router Deployment has replicas and a Ready
router pod (`RevisionState.reachable`), in the planner, the simulator's checker and (through
`observe.revision_states`) the cluster tier's watcher.

The dip the cluster tier saw on a superseded roll (A -> B -> C, 3 decode pods, maxUnavailable 0):
B was un-routed, and the operator, woken by its own write before the Deployment controller had
removed B's router pod, saw that pod still Ready, counted B's decode pods as serving and let A
give one up: 2 of 3 decode pods reachable. The simulator now plays that moment
(`SimCluster(controller_lag=True)`: the operator plans again between its write and the
controllers), and the superseded roll is explored over every policy, every tick C can arrive at,
and an operator down for a while from any tick of the B -> C roll.

The rollback finding (a pod of the old, serving revision removed while the new one failed): the
planner let an old revision whose router was not Ready at that moment shed every ready pod but
one per role, as if nothing served from it; during a failed roll those pods are all the capacity
there is. An old revision now gives up only what the reachable revisions hold beyond the floor.
One path remains, by design: an old revision's pod that is not Ready when the planner looks is
dropped (its replicas go down to its ready count): it is no capacity, and keeping it could wedge a
roll with maxSurge 0 whose old pod never recovers.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
from builders import pdd
from fake_cluster import FakeCluster
from pdmtp.api import vocabulary as v
from pdmtp.api.vocabulary import ENGINE_ROLES, EngineRole
from pdmtp.core.revision_state import RevisionState, RoleState
from pdmtp.core.rollout import planner
from pdmtp.core.rollout.invariants import InvariantMonitor, Moment
from pdmtp.core.rollout.planner import Policy, Target, plan
from pdmtp.core.rollout.removal import gate
from pdmtp.core.rollout.states import revision_states
from pdmtp.tools.simulate import InvariantViolation, SimCluster, Trace, simulate_rollout

MAX_TICKS = 3000
DIP_POLICY = Policy(max_surge=1, max_unavailable=0, drain_seconds=2)
SUPERSEDE_POLICIES = [
    Policy(surge, unavailable, drain)
    for surge in range(4)
    for unavailable in range(3)
    if surge + unavailable
    for drain in (0, 2)
]


def policy_id(p: Policy) -> str:
    return f"surge{p.max_surge}-unavail{p.max_unavailable}-drain{p.drain_seconds}"


def revisions(prefill: int, decode: int = 3) -> tuple[Target, Target, Target]:
    a, b, c = (Target(r, prefill, decode, 1) for r in ("aaaa", "bbbb", "cccc"))
    return a, b, c


# ---- what counts -----------------------------------------------------------------------------


def _deployment(revision: str, role: str, replicas: int, **annotations: str) -> dict[str, object]:
    return {
        "metadata": {
            "name": f"x-{revision}-{role}",
            "labels": {v.LABEL_NAME: "x", v.LABEL_REVISION: revision, v.LABEL_ROLE: role},
            "annotations": annotations,
            "creationTimestamp": "2027-01-15T08:00:00Z",
        },
        "spec": {"replicas": replicas},
    }


def _ready_pod(revision: str, role: str, index: int = 0) -> dict[str, object]:
    return {
        "metadata": {
            "name": f"x-{revision}-{role}-{index}",
            "labels": {v.LABEL_NAME: "x", v.LABEL_REVISION: revision, v.LABEL_ROLE: role},
        },
        "status": {
            "phase": "Running",
            "podIP": f"192.0.2.{index + 10}",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


@pytest.mark.parametrize(
    ("router", "reachable"),
    [
        pytest.param(_deployment("r", "router", 1), True, id="routed"),
        pytest.param(_deployment("r", "router", 0), False, id="scaled-to-zero"),
        pytest.param(
            _deployment("r", "router", 0, **{v.ANNOTATION_ROUTER_PARKED: "1"}), False, id="parked"
        ),
    ],
)
def test_only_a_router_deployment_with_replicas_and_a_ready_pod_is_reachable(
    router: dict[str, object], reachable: bool
) -> None:
    """The watcher's view (`observe.revision_states`): a Ready router pod whose Deployment is at
    zero (a drain just started, or parked for want of a routable membership) is on its way out;
    it may still answer (`serving`, the drain's clock) but the floor does not count it."""
    deployments = [_deployment("r", "prefill", 1), _deployment("r", "decode", 1), router]
    pods = [_ready_pod("r", "prefill"), _ready_pod("r", "decode"), _ready_pod("r", "router")]
    (state,) = revision_states(deployments, pods)
    assert state.serving
    assert state.reachable is reachable
    parked = v.ANNOTATION_ROUTER_PARKED in router["metadata"]["annotations"]  # type: ignore[index]
    assert state.router.replicas == (1 if parked else int(reachable)), "the planner's intent"


def test_the_checker_counts_only_what_a_client_can_reach() -> None:
    """The moment the cluster tier caught, as the checker reads it: B's router Deployment is at
    zero while its pod is still Ready; 1 + 1 decode pods reachable, not 3."""
    monitor = InvariantMonitor(DIP_POLICY)
    serving = RevisionState("aaaa", RoleState(1, 1, 1), RoleState(3, 3, 3), RoleState(1, 1, 1))
    monitor.retarget([serving], Target("cccc", 1, 3, 1))
    states = [
        replace(serving, decode=RoleState(1, 1, 1)),
        RevisionState(
            "bbbb",
            RoleState(1, 1, 1),
            RoleState(1, 1, 1),
            RoleState(0, 1, 1),
            drain_until=6.0,
            created=1.0,
        ),
        RevisionState(
            "cccc", RoleState(1, 1, 1), RoleState(2, 2, 1), RoleState(1, 1, 1), created=2.0
        ),
    ]
    (violation,) = monitor.check(Moment(5.0, states))
    assert violation.startswith("invariant 3 at t=5.0: 2 decode pods a client can reach")
    assert "bbbb [1, 1, 1, 0, 1]" in violation and "cccc [2, 1, 1, 1, 1]" in violation


# ---- the superseded roll's dip -----------------------------------------------------------------


def test_a_revision_just_unrouted_is_not_counted_while_its_router_pod_lingers() -> None:
    """The planner's step that made the dip (found by `test_the_dip_of_a_superseded_roll`): B was
    just un-routed and its router pod is still Ready. Counting B's decode pod, A had 3 + 1 = 4
    ready against a floor of 3 and gave one up (decode 3 -> 2), leaving 2 reachable."""
    observed = [
        RevisionState("aaaa", RoleState(1, 1, 1), RoleState(3, 3, 3), RoleState(1, 1, 1)),
        RevisionState(
            "bbbb",
            RoleState(1, 1, 1),
            RoleState(1, 1, 1),
            RoleState(0, 1, 1),
            drain_until=6.0,
            created=0.0,
        ),
    ]
    step = plan(observed, Target("cccc", 1, 3, 1), DIP_POLICY, now=4.0)
    a = step.for_revision("aaaa")
    assert a is not None and (a.decode, a.router) == (3, 1)


def _dip(sim: SimCluster, monitor: InvariantMonitor) -> Trace:
    """The roll that dipped: C arrives at tick 4 of A -> B, when B serves next to A."""
    _, b, c = revisions(prefill=1)
    rng = random.Random(0)
    simulate_rollout(sim, monitor, b, rng, max_ticks=4)
    return simulate_rollout(sim, monitor, c, rng, max_ticks=MAX_TICKS)


def test_the_dip_of_a_superseded_roll() -> None:
    """A -> B -> C, 1 prefill and 3 decode, maxSurge 1, maxUnavailable 0, C arriving at tick 4
    (B serving next to A), the operator planning again right after each write. Before the fix:

        invariant 3 at t=4.0 (after a step that saw its own write): 2 decode pods a client can
        reach, fewer than 3 (per revision [decode pods, Ready, router replicas, Ready routers]:
        aaaa [3, 2, 1, 1], bbbb [1, 1, 0, 0], cccc [0, 0, 0, 0])

    (A's third pod is marked leaving, so not counted; B's router pod has gone by then)."""
    a = revisions(prefill=1)[0]
    trace = _dip(SimCluster.serving("aaaa", a, controller_lag=True), InvariantMonitor(DIP_POLICY))
    assert trace.complete
    assert {s.revision for s in trace.steps[-1][1]} == {"cccc"}


def test_a_planner_counting_every_ready_router_pod_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The checks can fail: today's count (a Ready router pod makes a revision's pods capacity,
    whatever its Deployment asks for) dips below the floor in the simulation that plays the
    controllers' lag, and only there (the simulation without it never shows that moment)."""

    def every_ready_router(states: list[RevisionState], role: EngineRole) -> int:
        return sum(s.role(role).listed for s in states if s.serving)

    monkeypatch.setattr(planner, "reachable_ready", every_ready_router)
    a = revisions(prefill=1)[0]
    with pytest.raises(InvariantViolation, match="2 decode pods a client can reach, fewer than 3"):
        _dip(SimCluster.serving("aaaa", a, controller_lag=True), InvariantMonitor(DIP_POLICY))
    assert _dip(SimCluster.serving("aaaa", a), InvariantMonitor(DIP_POLICY)).complete


def _roll_length(a: Target, b: Target, policy: Policy, seed: int, lag: bool) -> int:
    """Ticks the A -> B roll takes alone (its planner steps, one or two per tick)."""
    trace = simulate_rollout(
        SimCluster.serving("aaaa", a, controller_lag=lag),
        InvariantMonitor(policy),
        b,
        random.Random(seed),
        max_ticks=MAX_TICKS,
    )
    assert trace.complete
    return len({now for now, _, _ in trace.steps})


def _supersede(
    a: Target,
    b: Target,
    c: Target,
    policy: Policy,
    seed: int,
    lag: bool,
    b_ticks: int,
    outages: dict[int, int] | None = None,
) -> None:
    rng = random.Random(seed)
    sim = SimCluster.serving("aaaa", a, controller_lag=lag)
    monitor = InvariantMonitor(policy)
    simulate_rollout(sim, monitor, b, rng, max_ticks=b_ticks)
    where = f"{policy}, seed {seed}, lag {lag}, C at tick {b_ticks}, outages {outages}"
    try:
        trace = simulate_rollout(sim, monitor, c, rng, max_ticks=MAX_TICKS, outages=outages)
    except InvariantViolation as e:
        raise InvariantViolation(f"{e} [{where}]") from e
    assert trace.complete, where
    assert {s.revision for s in sim.observe()} == {"cccc"}, where
    assert not [s for _, _, s in trace.steps if s.blocked], where


@pytest.mark.parametrize("policy", SUPERSEDE_POLICIES, ids=policy_id)
@pytest.mark.parametrize("prefill", [1, 2])
def test_a_superseded_roll_holds_the_floor_clients_see_whatever_tick_c_arrives(
    policy: Policy, prefill: int
) -> None:
    """3 decode pods; C arrives at every tick of the A -> B roll (before B exists, while it
    starts, serves next to A, drains A, and once complete), with and without the controllers'
    lag, for two random orders of pods turning Ready: 0 violations at every moment."""
    a, b, c = revisions(prefill)
    for lag in (False, True):
        for seed in (0, 1):
            for b_ticks in range(_roll_length(a, b, policy, seed, lag) + 1):
                _supersede(a, b, c, policy, seed, lag, b_ticks)


@pytest.mark.parametrize(
    "policy", [p for p in SUPERSEDE_POLICIES if p.drain_seconds == 2], ids=policy_id
)
def test_a_superseded_roll_holds_the_floor_with_the_operator_down_at_any_tick(
    policy: Policy,
) -> None:
    """As above (with the lag), and the operator down for 2 ticks from every tick of the B -> C
    roll: it continues from what it observes (invariant 6)."""
    a, b, c = revisions(prefill=1)
    seed = 0
    for b_ticks in range(_roll_length(a, b, policy, seed, lag=True) + 1):
        for down_at in range(_roll_length(a, c, policy, seed, lag=True)):
            _supersede(a, b, c, policy, seed, True, b_ticks, outages={down_at: 2})


# ---- the rollback finding ----------------------------------------------------------------------


def test_an_old_revision_whose_router_is_not_ready_keeps_its_pods_while_the_new_one_fails() -> None:
    """1P/2D, maxUnavailable 0, the new revision's decode refusing its config: before the fix,
    a moment when A's router pod was not Ready (a failed probe, a restart) made A count as
    serving nothing, and the planner took A down to one pod per role (decode 2 -> 1)."""
    observed = [
        RevisionState("aaaa", RoleState(1, 1, 1), RoleState(2, 2, 2), RoleState(1, 1, 0)),
        RevisionState("bbbb", RoleState(1, 1, 1), RoleState(1, 1, 0), created=5.0),
    ]
    step = plan(observed, Target("bbbb", 1, 2, 1), DIP_POLICY, now=9.0)
    a = step.for_revision("aaaa")
    assert a is not None and (a.prefill, a.decode, a.router) == (1, 2, 1)


@pytest.mark.parametrize("surge", [1, 2])
def test_a_failing_roll_never_removes_a_pod_of_the_serving_revision(surge: int) -> None:
    """1P/2D, maxUnavailable 0, the new revision's engines never Ready; at every tick of the
    failed roll A's router pod fails a probe for a moment (it turns Ready again by chance),
    then the roll is rolled back. No pod of A is ever marked to leave, terminated or scaled
    away, and the rollback completes."""
    a, b = Target("aaaa", 1, 2, 1), Target("bbbb", 1, 2, 1)
    policy = Policy(surge, 0, 2)
    for flap_at in range(12):
        for seed in range(3):
            rng = random.Random(seed)
            sim = SimCluster.serving("aaaa", a, failing={"bbbb"})
            for tick in range(15):
                if tick == flap_at:
                    for pod in sim.revisions["aaaa"].workloads["router"].pods:
                        pod.ready = False
                observed = sim.observe()
                step = plan(observed, b, policy, sim.now)
                removal = gate(step.revisions, observed, sim.engines(), sim.routers())
                sim.apply(step, removal)
                old = sim.revisions["aaaa"]
                for role in ENGINE_ROLES:
                    w = old.workloads[role]
                    assert w.replicas == a.replicas(role), (flap_at, seed, tick, role)
                    assert not [p for p in w.pods if p.leaving or p.terminating_for is not None]
                sim.advance(rng)
            monitor = InvariantMonitor(policy)
            assert simulate_rollout(sim, monitor, a, rng, max_ticks=MAX_TICKS).complete
            assert {s.revision for s in sim.observe()} == {"aaaa"}


# ---- the same, through the reconcile (steering, removal gate, rendering) -------------------

NOW = 1_800_000_000.0
REFUSAL = "lookahead mismatch: operator expects 2, vLLM computes 1"


def _labels(pod: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = pod["metadata"]["labels"]
    return labels


def _refuse(pod: dict[str, Any]) -> None:
    """What the kubelet reports of an engine whose launcher refused its config."""
    pod["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    pod["status"]["containerStatuses"] = [
        {
            "name": "engine",
            "restartCount": 0,
            "state": {
                "terminated": {
                    "exitCode": v.LAUNCHER_REFUSED_EXIT_CODE,
                    "reason": "Error",
                    "message": REFUSAL,
                }
            },
        }
    ]


@pytest.mark.parametrize("on_failure", ["Rollback", "Hold"])
@pytest.mark.parametrize("surge", [1, 2])
def test_through_the_reconcile_a_failed_roll_keeps_every_pod_of_the_serving_revision(
    on_failure: str, surge: int
) -> None:
    """1P/2D, maxUnavailable 0, the new revision's decode pods refusing their config, and A's
    router pod failing a probe at one tick of the failed roll (every tick in turn): `decide()`
    steered and gated as the operator runs it, pods in a simulating FakeCluster. No engine pod
    of A is marked to leave, released or deleted, and A's Deployments keep their replicas;
    with Rollback the failed revision is gone and A alone serves at the end."""
    for flap_at in range(8):
        for seed in range(2):
            b = (
                pdd("back")
                .mtp(3, modules=3)
                .prefill(replicas=1)
                .decode(replicas=2)
                .rollout(maxSurge=surge, maxUnavailable=0, drainSeconds=2, onFailure=on_failure)
            )
            body = b.dict()
            body["metadata"].update(namespace="ns", uid="u", generation=1)
            fc = FakeCluster(body, rng=random.Random(seed), linger=2)
            t = NOW
            for _ in range(40):
                fc.reconcile(t)
                fc.run_pods()
                fc.tick()
                t += 1
            old = (fc.body.get("status") or {}).get("currentRevision")
            assert old and (fc.body["status"]["rollout"] or {}).get("phase") == "Complete"
            engines = {n for n, p in fc.pods.items() if _labels(p)[v.LABEL_ROLE] in ENGINE_ROLES}
            assert len(engines) == 3
            fc.body["spec"]["speculative"]["numSpeculativeTokens"] = 2
            fc.body["metadata"]["generation"] = 2
            for step in range(30):
                fc.reconcile(t)
                fc.run_pods()
                fc.tick()
                t += 1
                for pod in fc.pods.values():
                    rev, role = _labels(pod)[v.LABEL_REVISION], _labels(pod)[v.LABEL_ROLE]
                    if rev != old and role == "decode":
                        _refuse(pod)
                    if step == flap_at and rev == old and role == "router":
                        pod["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
                where = f"{on_failure}, surge {surge}, flap at {flap_at}, seed {seed}, step {step}"
                assert engines <= set(fc.pods), f"{where}: {engines - set(fc.pods)} removed"
                for name in engines:
                    meta = fc.pods[name]["metadata"]
                    notes = meta.get("annotations") or {}
                    assert not meta.get("deletionTimestamp"), f"{where}: {name} deleted"
                    assert v.ANNOTATION_LEAVING not in notes, f"{where}: {name} leaving"
                for role, replicas in (("prefill", 1), ("decode", 2)):
                    deployment = fc.objects[f"Deployment/back-{old}-{role}"]
                    assert deployment["spec"]["replicas"] == replicas, where
            revisions = {_labels(p)[v.LABEL_REVISION] for p in fc.pods.values()}
            rollout = fc.body["status"]["rollout"]
            if on_failure == "Rollback":
                assert revisions == {old} and rollout["phase"] == "RolledBack", rollout
            else:
                assert rollout["phase"] == "Failed", rollout

"""A pod leaves routing before it leaves the cluster (`core.rollout.removal`): the gate's steps one
by one, then whole scale changes simulated (while serving, during a canary hold; at any step of a
paired rollout in test_planner's mid-roll scaling test, whose monitor checks it too) with
invariant 8 (no engine pod terminates while a router of its revision lists it)
checked at every moment, and shown to fail without the gate."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from builders import pdd
from fake_cluster import FakeCluster
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pdmtp.api import reasons
from pdmtp.api import vocabulary as v
from pdmtp.core.objects import engine_url
from pdmtp.core.render.membership import router_urls
from pdmtp.core.revision_state import RevisionState, RoleState
from pdmtp.core.rollout.invariants import InvariantMonitor
from pdmtp.core.rollout.planner import Policy, RevisionPlan, Target
from pdmtp.core.rollout.removal import EnginePod, RouterPod, gate
from pdmtp.tools.simulate import InvariantViolation, SimCluster, simulate_rollout
from rollout_strategies import policies, replicas, targets

MAX_TICKS = 3000
NOW = 1_800_000_000.0


def engine(
    name: str,
    *,
    ready: bool = True,
    leaving: bool = False,
    released: bool = False,
    created: float = 0.0,
    role: str = "decode",
) -> EnginePod:
    return EnginePod(name, "r1", role, f"u-{name}", ready, leaving, released, created)  # type: ignore[arg-type]


def state(decode: int, router: int = 1) -> RevisionState:
    return RevisionState(
        "r1",
        RoleState(1, 1, 1),
        RoleState(decode, decode, decode),
        RoleState(router, router, router),
    )


def one(decode: int, router: int = 1) -> list[RevisionPlan]:
    return [RevisionPlan("r1", 1, decode, router)]


PREFILL = engine("p", role="prefill")


def test_a_scale_down_marks_its_victim_and_holds_while_a_router_lists_it() -> None:
    pods = [PREFILL, engine("a", created=1), engine("b", created=2), engine("c", created=3)]
    routers = [RouterPod("r1", frozenset({"u-p", "u-a", "u-b", "u-c"}))]
    removal = gate(one(2), [state(3)], pods, routers)
    assert removal.plans[0].decode == 3, "held: the router still lists the victim"
    assert removal.leaving == {"c"}, "the newest pod goes first, as the ReplicaSet ranks"
    assert removal.released == set()
    assert [w.pod for w in removal.waiting] == ["c"]
    assert removal.changes(pods) == [("c", True, False)]


def test_once_unlisted_the_victim_is_released_then_removed() -> None:
    marked = [PREFILL, engine("a"), engine("b"), engine("c", leaving=True, created=3)]
    unlisted = [RouterPod("r1", frozenset({"u-p", "u-a", "u-b"}))]
    released = gate(one(2), [state(3)], marked, unlisted)
    assert released.plans[0].decode == 3, "the release must be observed before the scale"
    assert released.released == {"c"}
    observed = [*marked[:3], engine("c", leaving=True, released=True, created=3)]
    assert gate(one(2), [state(3)], observed, unlisted).plans[0].decode == 2


def test_a_terminating_router_that_still_lists_the_victim_holds_it() -> None:
    marked = [PREFILL, engine("a"), engine("c", leaving=True, released=True)]
    routers = [
        RouterPod("r1", frozenset({"u-p", "u-a"})),
        RouterPod("r1", frozenset({"u-p", "u-a", "u-c"})),  # the old router, in its preStop
    ]
    removal = gate(one(1), [state(2)], marked, routers)
    assert removal.plans[0].decode == 2 and removal.released == set()


def test_a_scale_up_before_removal_returns_the_victim_to_routing() -> None:
    marked = [PREFILL, engine("a"), engine("c", leaving=True, released=True)]
    removal = gate(one(2), [state(2)], marked, [RouterPod("r1", frozenset({"u-p", "u-a"}))])
    assert removal.leaving == set() and removal.changes(marked) == [("c", False, False)]


def test_scaled_but_not_yet_deleted_keeps_its_mark() -> None:
    # The Deployment is at 1 already; the ReplicaSet has not deleted the victim yet.
    marked = [PREFILL, engine("a"), engine("c", leaving=True, released=True)]
    removal = gate(one(1), [state(1)], marked, [RouterPod("r1", frozenset({"u-p", "u-a"}))])
    assert removal.leaving == {"c"} and removal.plans[0].decode == 1


def test_an_unready_pod_goes_first_and_an_unrouted_revision_scales_at_once() -> None:
    pods = [PREFILL, engine("a", created=5), engine("b", ready=False, created=1)]
    removal = gate(one(1), [state(2)], pods, [RouterPod("r1", frozenset({"u-p", "u-a"}))])
    assert removal.leaving == {"b"} and removal.released == {"b"}
    # Neither routed nor about to be: nothing lists its pods, the Deployment scales directly.
    assert gate(one(1, router=0), [state(2, router=0)], pods, []).plans[0].decode == 1


# ---- whole scale changes, simulated -----------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    start=targets("aaaa"),
    sizes=st.lists(st.tuples(replicas, replicas), min_size=1, max_size=4),
    policy=policies,
    seed=st.integers(0, 2**32),
)
def test_scaling_while_serving_never_terminates_a_listed_pod(
    start: Target, sizes: list[tuple[int, int]], policy: Policy, seed: int
) -> None:
    rng = random.Random(seed)
    sim = SimCluster.serving("aaaa", start)
    monitor = InvariantMonitor(policy)
    for prefill, decode in sizes:
        target = replace(start, prefill=prefill, decode=decode)
        assert simulate_rollout(sim, monitor, target, rng, max_ticks=MAX_TICKS).complete
        (final,) = sim.observe()
        assert (final.prefill.pods, final.decode.pods) == (prefill, decode)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    a=targets("aaaa"),
    seed=st.integers(0, 2**32),
    percent=st.sampled_from([25, 50, 75]),
    prefill=replicas,
    decode=replicas,
)
def test_scaling_during_a_canary_hold_keeps_every_invariant(
    a: Target, seed: int, percent: int, prefill: int, decode: int
) -> None:
    rng = random.Random(seed)
    b = replace(a, revision="bbbb")
    sim = SimCluster.serving("aaaa", a)
    monitor = InvariantMonitor(Policy(1, 0, 2))
    canary = replace(monitor.policy, canary_percent=percent)
    held = simulate_rollout(
        sim, monitor, b, rng, policy=canary, until=lambda s: s.outcome == "Held"
    )
    assert held.steps[-1][2].outcome == "Held"
    scaled = replace(b, prefill=prefill, decode=decode)
    simulate_rollout(sim, monitor, scaled, rng, policy=canary, until=lambda s: s.outcome == "Held")
    assert simulate_rollout(sim, monitor, scaled, rng, max_ticks=MAX_TICKS).complete, "promoted"


def test_without_the_gate_a_scale_down_terminates_a_listed_pod(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The invariant can fail: the Deployment scaled at once, as before the gate existed."""
    monkeypatch.setattr(
        "pdmtp.tools.simulate.gate",
        lambda plans, states, engines, routers: replace(
            gate(plans, states, engines, routers), plans=tuple(plans)
        ),
    )
    sim = SimCluster.serving("aaaa", Target("aaaa", 2, 3, 1))
    with pytest.raises(InvariantViolation, match="invariant 8"):
        simulate_rollout(
            sim, InvariantMonitor(Policy(1, 0, 0)), Target("aaaa", 1, 1, 1), random.Random(0)
        )


# ---- through the reconcile: marks, the router's roll, release, scale -------------------------


def _listed(fc: FakeCluster) -> set[str]:
    return {
        url
        for pod in fc.pods.values()
        if pod["metadata"]["labels"][v.LABEL_ROLE] == "router"
        for url in router_urls(pod["spec"]["containers"][0]["args"])
    }


@pytest.mark.parametrize("gated", [True, False])
def test_the_reconcile_removes_a_decode_only_once_its_router_stopped_listing_it(
    gated: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not gated:  # the control: the Deployment scaled at once, as before the gate
        monkeypatch.setattr(
            "pdmtp.core.reconcile.gate",
            lambda plans, *rest: replace(gate(plans, *rest), plans=tuple(plans)),
        )
    b = pdd("x").mtp(1).decode(replicas=3)
    fc = FakeCluster(b.dict() | {"metadata": {"name": "x", "namespace": "ns", "uid": "u"}})
    for t in range(3):
        fc.reconcile(NOW + t)
        fc.run_pods()
    decodes = {n for n, p in fc.pods.items() if p["metadata"]["labels"][v.LABEL_ROLE] == "decode"}
    assert len(decodes) == 3
    fc.body["spec"]["decode"]["replicas"] = 1
    events: list[str] = []
    for t in range(3, 15):
        decision = fc.reconcile(NOW + t)
        events += [e.reason for e in decision.events]
        listed = _listed(fc)  # the routers as they run while this step's writes land
        before = {n: p["status"]["podIP"] for n, p in fc.pods.items()}
        fc.run_pods()
        removed = [n for n in before if n not in fc.pods and n in decodes]
        if not gated and removed:
            assert {engine_url(before[n]) for n in removed} <= listed
            return
        for name in removed:
            assert engine_url(before[name]) not in listed, f"{name} removed while listed"
    assert gated
    left = [n for n, p in fc.pods.items() if p["metadata"]["labels"][v.LABEL_ROLE] == "decode"]
    assert len(left) == 1 and left[0] in decodes, "one of the serving decodes stays"
    assert events.count(reasons.POD_LEAVING) == 2
    assert not any(
        v.ANNOTATION_LEAVING in (p["metadata"].get("annotations") or {}) for p in fc.pods.values()
    )

"""Engine pods on a cordoned node are moved as a planned scale-down would move them: a
replacement first, then the pod out of its routers' lists, then gone (`core.rollout.evacuation`), so
the drain that cordoned the node finds no engine to evict. Pure decisions, then whole drains
simulated through the real `decide` with the invariants checked at every step."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest
from builders import compat_revision, pdd
from pdmtp.api import vocabulary as v
from pdmtp.api.v1alpha1 import PDDeployment
from pdmtp.core.objects import is_terminating, pod_ready
from pdmtp.core.revision_state import RevisionState, RoleState
from pdmtp.core.rollout.evacuation import evacuate
from pdmtp.core.rollout.planner import Policy, RevisionPlan, clients_reach
from pdmtp.core.rollout.removal import EnginePod, _victim_order
from pdmtp.core.rollout.states import revision_states

from tests.support.fake_cluster import FakeCluster

NOW = 1_800_000_000.0
POLICY = Policy(max_surge=1, max_unavailable=0, drain_seconds=0)


def pod(name: str, ready: bool = True, evacuate_: bool = False, leaving: bool = False) -> EnginePod:
    return EnginePod(
        name=name,
        revision="r",
        role="decode",
        url=f"http://{name}",
        ready=ready,
        leaving=leaving,
        released=False,
        created=0.0,
        evacuate=evacuate_,
    )


def decode_replicas(
    engines: list[EnginePod], want: int = 2, policy: Policy = POLICY, terminating: int = 0
) -> int:
    state = RevisionState(
        "r", RoleState(1, 1, 1), RoleState(len(engines), len(engines) + terminating, 0)
    )
    plan = RevisionPlan("r", prefill=1, decode=want, router=1)
    (p,) = evacuate([plan], [state], engines, policy)
    assert p.prefill == 1  # no pod of that role is stranded: its count stands
    return p.decode


def test_nothing_cordoned_changes_nothing() -> None:
    engines = [pod("a"), pod("b")]
    assert decode_replicas(engines) == 2


@pytest.mark.parametrize(
    ("engines", "replicas"),
    [
        # One of two on the cordoned node: one replacement first...
        ([pod("a"), pod("b", evacuate_=True)], 3),
        # ... still starting: keep asking for it, remove nothing.
        ([pod("a"), pod("b", evacuate_=True), pod("c", ready=False)], 3),
        # ... Ready: the plan's own count, and the gate takes the stranded pod.
        ([pod("a"), pod("b", evacuate_=True), pod("c")], 2),
        # Both stranded, maxSurge 1: one at a time.
        ([pod("a", evacuate_=True), pod("b", evacuate_=True)], 3),
        ([pod("a", evacuate_=True), pod("b", evacuate_=True), pod("c")], 2),
        ([pod("b", evacuate_=True), pod("c")], 3),
        # A stranded pod that is not Ready holds nothing up: it may go at once.
        ([pod("a"), pod("c"), pod("b", ready=False, evacuate_=True)], 2),
        # Leaving already (the gate took it): not counted again.
        ([pod("a"), pod("c"), pod("b", evacuate_=True, leaving=True)], 2),
    ],
)
def test_replacement_first_one_surge_at_a_time(engines: list[EnginePod], replicas: int) -> None:
    assert decode_replicas(engines) == replicas


def test_without_surge_nothing_is_moved_and_the_budget_lets_the_drain_evict() -> None:
    no_surge = replace(POLICY, max_surge=0, max_unavailable=1)
    assert decode_replicas([pod("a"), pod("b", evacuate_=True)], policy=no_surge) == 2


def test_a_terminating_pod_holds_its_place_under_the_surge() -> None:
    assert decode_replicas([pod("a"), pod("b", evacuate_=True)], terminating=1) == 2


def test_a_wider_surge_moves_more_at_once() -> None:
    wide = replace(POLICY, max_surge=2)
    stranded = [pod("a", evacuate_=True), pod("b", evacuate_=True)]
    assert decode_replicas(stranded, policy=wide) == 4


def test_a_deleted_revision_and_a_role_at_zero_are_left_alone() -> None:
    engines = [pod("b", evacuate_=True)]
    gone = RevisionPlan("r", prefill=0, decode=0, router=0, delete=True)
    assert evacuate([gone], [RevisionState("r")], engines, POLICY) == (gone,)
    assert decode_replicas(engines, want=0) == 0


def test_the_gate_takes_the_cordoned_nodes_pods_first() -> None:
    engines = [pod("a"), pod("b", evacuate_=True), pod("c", ready=False)]
    assert [p.name for p in _victim_order(engines)][:1] == ["b"]


# ---- whole drains, simulated ---------------------------------------------------------------------


def live_engines(cluster: FakeCluster, role: str) -> list[dict]:  # type: ignore[type-arg]
    return [
        p
        for p in cluster.pods.values()
        if p["metadata"]["labels"].get(v.LABEL_ROLE) == role and not is_terminating(p)
    ]


@pytest.mark.parametrize(("seed", "replicas"), list(itertools.product(range(6), (1, 2, 3))))
def test_a_cordoned_nodes_engines_move_off_with_the_floor_held_throughout(
    seed: int, replicas: int
) -> None:
    b = pdd("x").prefill(replicas=replicas).decode(replicas=replicas).rollout(drainSeconds=0)
    obj = b.dict()
    obj["metadata"].update(namespace="ns", uid="u-1", generation=1)
    cluster = FakeCluster(obj, rng=random.Random(seed), linger=2)
    rev = compat_revision(PDDeployment.model_validate(obj).spec)
    t = NOW

    def step(operator: bool = True) -> None:
        nonlocal t
        if operator:
            cluster.reconcile(t)
        cluster.run_pods()
        cluster.tick()
        t += 1

    def reached() -> list[int]:
        deployments = [o for k, o in cluster.objects.items() if k.startswith("Deployment/")]
        states = revision_states(deployments, list(cluster.pods.values()))
        return [clients_reach(states, role) for role in ("prefill", "decode")]

    while not all(
        len(live_engines(cluster, r)) == replicas
        and all(pod_ready(p) for p in live_engines(cluster, r))
        for r in ("prefill", "decode")
    ) or reached() != [replicas, replicas]:
        step()
        assert t < NOW + 200, "never came up"
    rng = random.Random(seed)
    # A drain cordons one node per role's pod (each simulated pod has a node of its own): the
    # worst case, every engine of the revision stranded, for half the seeds.
    everything = seed % 2 == 0
    stranded = {
        p["spec"]["nodeName"]
        for r in ("prefill", "decode")
        for p in (
            live_engines(cluster, r) if everything else rng.sample(live_engines(cluster, r), 1)
        )
    }
    cluster.cordoned = frozenset(stranded)
    # The operator is killed for 2 ticks at some tick of the drain (a different one per seed).
    down = range(seed + 1, seed + 3)
    for tick in range(120):
        step(operator=tick not in down)
        # maxUnavailable 0: the Ready pods a Ready router pod lists (what clients reach) never
        # drop below the replicas...
        assert min(reached()) >= replicas, (t, reached())
        for role in ("prefill", "decode"):
            # ... and maxSurge 1 bounds what runs, terminating pods included (invariant 3).
            everyone = [
                p
                for p in cluster.pods.values()
                if p["metadata"]["labels"].get(v.LABEL_ROLE) == role
            ]
            assert len(everyone) <= replicas + 1, (role, len(everyone))
        on_cordoned = [p for p in cluster.pods.values() if p["spec"].get("nodeName") in stranded]
        if not on_cordoned:
            break
    else:
        raise AssertionError(f"pods left on the cordoned nodes: {sorted(stranded)}")
    deployments = {
        k: o["spec"]["replicas"] for k, o in cluster.objects.items() if k.startswith("Deployment/")
    }
    assert deployments[f"Deployment/x-{rev}-prefill"] == replicas
    assert deployments[f"Deployment/x-{rev}-decode"] == replicas

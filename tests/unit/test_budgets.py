"""Disruption budgets (`core.render.budgets`): what each (revision, engine role)'s
PodDisruptionBudget allows, checked against the disruption controller's arithmetic, and how the
reconcile creates, corrects, keeps and deletes them through rollouts, scaling and retirement."""

from __future__ import annotations

import copy
import random
from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from builders import compat_revision, pdd
from pdmtp.api import vocabulary as v
from pdmtp.api.v1alpha1 import PDDeployment, RolloutSpec
from pdmtp.api.vocabulary import EngineRole
from pdmtp.core import names
from pdmtp.core.actions import Action, Apply, Delete
from pdmtp.core.agreement import check
from pdmtp.core.objects import pod_ready
from pdmtp.core.reconcile import Decision
from pdmtp.core.render import budgets
from pdmtp.core.render.children import RevisionReplicas, revision_children

from tests.support.fake_cluster import FakeCluster

Obj = dict[str, Any]
NOW = 1_800_000_000.0
PDB = v.DISRUPTION_BUDGET_KIND


# ---- the disruption controller's arithmetic (pkg/controller/disruption, getExpectedPodCount) ----


def disruptions_allowed(budget: Mapping[str, Any], healthy: int, pods: int, scale: int) -> int:
    """status.disruptionsAllowed of `budget` over `pods` selected pods, `healthy` of them Ready
    and not terminating, whose controllers' scale sums to `scale` (used by maxUnavailable)."""
    spec = budget["spec"]
    if "maxUnavailable" in spec:
        desired = max(0, scale - int(spec["maxUnavailable"]))
    else:
        desired = int(spec["minAvailable"])
        del pods  # an integer minAvailable counts the selected pods, not a controller's scale
    return max(0, healthy - desired)


def matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    assert set(selector) == {"matchLabels"}, "budgets select by labels only"
    return all(labels.get(k) == val for k, val in selector["matchLabels"].items())


SOME_REPLICAS = RevisionReplicas(2, 3, 1)


def rendered(b: Any, replicas: RevisionReplicas = SOME_REPLICAS) -> dict[str, Obj]:
    obj = b.build()
    rev = compat_revision(obj.spec)
    return {
        f"{m['kind']}/{m['metadata']['name']}": m
        for m in revision_children(obj, rev, replicas, check(obj.spec), None)
    }


def budgets_of(objs: Mapping[str, Obj]) -> dict[str, Obj]:
    return {k: o for k, o in objs.items() if k.startswith(f"{PDB}/")}


# ---- how many -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("surge", "unavailable"),
    # Every pair the API accepts (both 0 cannot move a rollout).
    [(s, u) for s in (0, 1, 3) for u in (0, 1, 2, 5) if s or u],
)
def test_the_allowance_is_zero_where_the_operator_moves_pods_else_the_floor_and_never_zero(
    surge: int, unavailable: int
) -> None:
    rollout = RolloutSpec(max_surge=surge, max_unavailable=unavailable)
    # May surge: a drain waits while the operator moves each pod, replacement first
    # (core.rollout.evacuation). Cannot, or a multi-node role: the floor, at least 1.
    assert budgets.allowance(rollout) == (0 if surge else max(1, unavailable))
    assert budgets.allowance(rollout, grouped=True) == max(1, unavailable)
    for explicit in (1, 2, 7):
        own = RolloutSpec.model_validate(
            {
                "maxSurge": surge,
                "maxUnavailable": unavailable,
                "disruptionBudget": {"maxUnavailable": explicit},
            }
        )
        assert budgets.allowance(own) == explicit
        assert budgets.allowance(own, grouped=True) == explicit


def test_an_explicit_budget_of_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        RolloutSpec.model_validate({"disruptionBudget": {"maxUnavailable": 0}})


# ---- what each budget selects and says ----------------------------------------------------------


def test_a_budget_per_engine_role_selects_exactly_that_revisions_role() -> None:
    a, b = pdd("x").mtp(1, modules=1), pdd("x").mtp(3, modules=3)
    objs = {**rendered(a), **rendered(b)}
    revs = {compat_revision(a.build().spec), compat_revision(b.build().spec)}
    assert len(revs) == 2
    pod_labels = {(rev, role): names.pod_labels("x", rev, role) for rev in revs for role in v.ROLES}
    found = budgets_of(objs)
    assert set(found) == {
        f"{PDB}/{names.disruption_budget('x', rev, role)}"
        for rev in revs
        for role in v.ENGINE_ROLES
    }
    for budget in found.values():
        labels = budget["metadata"]["labels"]
        mine = (labels[v.LABEL_REVISION], labels[v.LABEL_ROLE])
        selected = {
            key for key, pl in pod_labels.items() if matches(budget["spec"]["selector"], pl)
        }
        assert selected == {mine}
        workload = objs[f"Deployment/{budget['metadata']['name']}"]
        # The workload's own selector, labels and owner: the budget is one of its children.
        assert budget["spec"]["selector"] == workload["spec"]["selector"]
        assert budget["metadata"]["labels"] == workload["metadata"]["labels"]
        assert budget["metadata"]["ownerReferences"] == workload["metadata"]["ownerReferences"]
        assert budget["apiVersion"] == "policy/v1"
        assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


@pytest.mark.parametrize(("surge", "unavailable"), [(0, 1), (0, 2), (1, 0), (1, 2)])
def test_a_deployments_budget_follows_its_replicas_without_a_rewrite(
    surge: int, unavailable: int
) -> None:
    b = pdd("x").rollout(maxSurge=surge, maxUnavailable=unavailable)
    k = budgets.allowance(RolloutSpec(max_surge=surge, max_unavailable=unavailable))
    manifests = {n: budgets_of(rendered(b, RevisionReplicas(n, n, 1))) for n in range(1, 9)}
    first = manifests[1]
    assert all(m == first for m in manifests.values()), "scaling must not change a budget"
    for budget in first.values():
        assert budget["spec"]["maxUnavailable"] == k
        assert "minAvailable" not in budget["spec"]
        for replicas in range(1, 9):
            for healthy in range(replicas + 1):
                allowed = disruptions_allowed(budget, healthy, replicas, replicas)
                # The floor a drain keeps: replicas - k Ready pods, never fewer.
                assert healthy - allowed >= min(healthy, replicas - k)
                # All Ready: a drain proceeds by evictions, or (k 0) waits for the operator
                # to move each pod (core.rollout.evacuation).
                if healthy == replicas:
                    assert allowed == min(k, replicas)
                    assert allowed > 0 or surge > 0


MULTI_NODE = {"nodes": 2, "layout": "DataParallel", "dataParallelSize": 16, "expertParallel": True}


@pytest.mark.parametrize("nodes", [2, 3, 4])
@pytest.mark.parametrize("allowed", [1, 2, 3])
def test_a_multi_node_budget_lets_a_drain_break_at_most_its_allowance_of_groups(
    nodes: int, allowed: int
) -> None:
    for groups in range(6):
        budget = budgets.disruption_budget_manifest(
            pdd("x").build(), "r", "decode", allowed, nodes=nodes, groups=groups
        )
        assert "maxUnavailable" not in budget["spec"]
        pods = nodes * groups
        assert budget["spec"]["minAvailable"] == max(0, pods - allowed)
        # The worst drain: each eviction hits a member of a group still whole.
        members = [nodes] * groups
        healthy, broken = pods, 0
        while disruptions_allowed(budget, healthy, pods, 0) > 0:
            whole = [i for i, m in enumerate(members) if m == nodes]
            if not whole:
                break
            members[whole[0]] -= 1
            healthy -= 1
            broken += 1
        assert broken <= allowed
        if groups:
            assert broken == min(allowed, groups), "a drain must be able to proceed"
        # The operator deletes the broken groups' other members (they stop counting as
        # healthy): nothing more may go until replacements are Ready.
        healthy = nodes * (groups - broken)
        if broken:
            assert disruptions_allowed(budget, healthy, pods, 0) == 0


def test_a_multi_node_role_gets_a_budget_over_every_member_of_its_groups() -> None:
    b = pdd("x").decode(replicas=2, multiNode=MULTI_NODE)
    objs = rendered(b, RevisionReplicas(1, 2, 1))
    rev = compat_revision(b.build().spec)
    decode = objs[f"{PDB}/{names.disruption_budget('x', rev, 'decode')}"]
    prefill = objs[f"{PDB}/{names.disruption_budget('x', rev, 'prefill')}"]
    assert decode["spec"]["minAvailable"] == 2 * 2 - 1
    assert prefill["spec"]["maxUnavailable"] == 0  # moved by the operator (core.rollout.evacuation)
    members = [o for o in objs.values() if o["kind"] == "Pod"]
    assert len(members) == 4
    assert all(matches(decode["spec"]["selector"], p["metadata"]["labels"]) for p in members)
    assert not any(matches(prefill["spec"]["selector"], p["metadata"]["labels"]) for p in members)


# ---- through the reconcile ----------------------------------------------------------------------


def cluster_of(b: Any) -> FakeCluster:
    obj = b.dict()
    obj["metadata"].update(namespace="ns", uid="u-1", generation=1)
    return FakeCluster(obj)


def settle(cluster: FakeCluster, start: float, rounds: int = 12) -> list[Decision]:
    out = []
    for i in range(rounds):
        out.append(cluster.reconcile(start + i))
        cluster.run_pods()
        cluster.place_groups()
    return out


def revise(cluster: FakeCluster, **spec: Any) -> str:
    cluster.body["spec"].update(spec)
    cluster.body["metadata"]["generation"] += 1
    return compat_revision(PDDeployment.model_validate(cluster.body).spec)


def live_budgets(cluster: FakeCluster) -> dict[str, Obj]:
    return {k: o for k, o in cluster.objects.items() if k.startswith(f"{PDB}/")}


def budget_writes(decisions: Iterable[Decision]) -> list[Action]:
    return [a for d in decisions for a in d.actions if a.kind == PDB]


def expected(name: str, revs: Iterable[str]) -> set[str]:
    return {
        f"{PDB}/{names.disruption_budget(name, rev, role)}"
        for rev in revs
        for role in v.ENGINE_ROLES
    }


def test_budgets_come_with_the_revision_and_a_settled_one_costs_no_write() -> None:
    cluster = cluster_of(pdd("x").prefill(replicas=2).decode(replicas=2))
    rev = compat_revision(PDDeployment.model_validate(cluster.body).spec)
    settle(cluster, NOW)
    assert set(live_budgets(cluster)) == expected("x", [rev])
    assert cluster.reconcile(NOW + 100).actions == ()


def test_an_edited_or_deleted_budget_is_restored() -> None:
    cluster = cluster_of(pdd("x").prefill(replicas=2).decode(replicas=2))
    rev = compat_revision(PDDeployment.model_validate(cluster.body).spec)
    settle(cluster, NOW)
    key = f"{PDB}/{names.disruption_budget('x', rev, 'prefill')}"
    cluster.objects[key]["spec"]["maxUnavailable"] = 3
    cluster.objects[key]["spec"]["unhealthyPodEvictionPolicy"] = "IfHealthyBudget"
    cluster.objects[key]["metadata"]["annotations"] = {"someone": "else"}  # not ours: kept
    d = cluster.reconcile(NOW + 100)
    (fix,) = d.actions
    assert isinstance(fix, Apply) and fix.key == key and fix.exists
    assert sorted(fix.drift) == ["spec.maxUnavailable", "spec.unhealthyPodEvictionPolicy"]
    del cluster.objects[key]
    (again,) = cluster.reconcile(NOW + 101).actions
    assert isinstance(again, Apply) and again.key == key and not again.exists


def test_scaling_rewrites_no_deployment_budget() -> None:
    cluster = cluster_of(pdd("x").prefill(replicas=3).decode(replicas=3))
    rev = compat_revision(PDDeployment.model_validate(cluster.body).spec)
    settle(cluster, NOW)
    before = copy.deepcopy(live_budgets(cluster))
    spec = cluster.body["spec"]
    revise(
        cluster,
        prefill={**spec["prefill"], "replicas": 1},
        decode={**spec["decode"], "replicas": 5},
    )
    decisions = settle(cluster, NOW + 100, rounds=16)
    assert (
        len(cluster.pods_of(f"{rev}-prefill")) == 1 and len(cluster.pods_of(f"{rev}-decode")) == 5
    )
    assert budget_writes(decisions) == []
    assert live_budgets(cluster) == before


def test_a_paired_rollout_moves_the_budgets_and_retires_the_old_ones_first() -> None:
    # Report: no engine metrics here, and the budgets are the question, not the verdict's hold.
    b = pdd("x").prefill(replicas=2).decode(replicas=2).rollout(drainSeconds=0)
    cluster = cluster_of(b.set(verification={"mode": "Report"}))
    old = compat_revision(PDDeployment.model_validate(cluster.body).spec)
    settle(cluster, NOW)
    new = revise(cluster, speculative={"method": "mtp", "numSpeculativeTokens": 2})
    assert new != old
    decisions = settle(cluster, NOW + 100, rounds=30)
    assert set(live_budgets(cluster)) == expected("x", [new])
    assert not cluster.pods_of(f"{old}-prefill") and not cluster.pods_of(f"{old}-decode")
    (retiring,) = [
        d
        for d in decisions
        if any(isinstance(a, Delete) and a.kind == "Deployment" for a in d.actions)
    ]
    kinds = [a.kind for a in retiring.actions if isinstance(a, Delete)]
    # Budgets go first: one left by a refused delete would outlive the revision.
    assert kinds[:2] == [PDB, PDB] and "Deployment" in kinds[2:]


def test_changing_the_budget_rolls_nothing() -> None:
    cluster = cluster_of(pdd("x").prefill(replicas=2).decode(replicas=2))
    rev = compat_revision(PDDeployment.model_validate(cluster.body).spec)
    settle(cluster, NOW)
    after = revise(cluster, rollout={"disruptionBudget": {"maxUnavailable": 2}})
    assert after == rev
    d = cluster.reconcile(NOW + 100)
    # The new spec is recorded (`pdmtp rollout undo`); no workload is touched.
    writes = {a.key for a in d.actions if a.kind != "ControllerRevision"}
    assert writes == expected("x", [rev])
    fixes = [a for a in d.actions if isinstance(a, Apply) and a.kind == PDB]
    assert len(fixes) == 2 and all(a.manifest["spec"]["maxUnavailable"] == 2 for a in fixes)


def test_a_budget_whose_revision_is_gone_is_deleted() -> None:
    cluster = cluster_of(pdd("x"))
    settle(cluster, NOW)
    stale = budgets.disruption_budget_manifest(pdd("x").build(), "deadbeef", "decode", 1)
    stale["metadata"]["namespace"] = "ns"
    cluster.objects[f"{PDB}/{stale['metadata']['name']}"] = stale
    other = copy.deepcopy(stale)
    other["metadata"]["labels"][v.LABEL_NAME] = "y"
    other["metadata"]["name"] = "y-deadbeef-decode"
    cluster.objects[f"{PDB}/y-deadbeef-decode"] = other
    (gone,) = cluster.reconcile(NOW + 100).actions
    assert isinstance(gone, Delete) and gone.key == f"{PDB}/x-deadbeef-decode"


def test_a_multi_node_budget_follows_the_group_count_after_the_groups_go() -> None:
    b = pdd("ds").decode(replicas=2, multiNode=MULTI_NODE)
    cluster = cluster_of(b)
    rev = compat_revision(PDDeployment.model_validate(cluster.body).spec)
    key = f"{PDB}/{names.disruption_budget('ds', rev, 'decode')}"
    settle(cluster, NOW)
    assert cluster.objects[key]["spec"]["minAvailable"] == 3
    spec = cluster.body["spec"]
    revise(cluster, decode={**spec["decode"], "replicas": 3})
    settle(cluster, NOW + 100)
    assert cluster.objects[key]["spec"]["minAvailable"] == 5
    revise(cluster, decode={**spec["decode"], "replicas": 1})
    decisions = settle(cluster, NOW + 200, rounds=16)
    assert cluster.objects[key]["spec"]["minAvailable"] == 1
    members = [
        p for p in cluster.pods.values() if p["metadata"]["labels"][v.LABEL_ROLE] == "decode"
    ]
    assert len(members) == 2
    for d in decisions:
        keys = [a.key for a in d.actions]
        if key in keys:
            # Never shrunk while the groups it stops counting still run: their deletes first.
            deleted = [i for i, a in enumerate(d.actions) if isinstance(a, Delete)]
            assert all(i < keys.index(key) for i in deleted)
    assert any(
        key in [a.key for a in d.actions] and any(isinstance(a, Delete) for a in d.actions)
        for d in decisions
    )


# ---- a drain during the operator's own scale-down -----------------------------------------------


def _leaving(pod: Obj) -> bool:
    return v.ANNOTATION_LEAVING in (pod["metadata"].get("annotations") or {})


def _drain_view(
    cluster: FakeCluster, name: str, rev: str, role: EngineRole
) -> tuple[int, int, int]:
    """(pods serving, pods leaving, evictions the budget allows) for one (revision, role), as the
    disruption controller counts once the controllers acted; for a multi-node role, groups
    serving and leaving (a group serves when all its members are healthy and its leader is not
    leaving; a drain's worst case takes one pod of a different serving group per eviction)."""
    budget = cluster.objects[f"{PDB}/{names.disruption_budget(name, rev, role)}"]
    mine = [
        p
        for p in cluster.pods.values()
        if p["metadata"]["labels"].get(v.LABEL_REVISION) == rev
        and p["metadata"]["labels"].get(v.LABEL_ROLE) == role
    ]
    healthy = [p for p in mine if pod_ready(p)]
    if "maxUnavailable" in budget["spec"]:
        replicas = cluster.objects[f"Deployment/{names.workload(name, rev, role)}"]["spec"]
        allowed = disruptions_allowed(budget, len(healthy), len(mine), replicas["replicas"])
        leaving = sum(_leaving(p) for p in healthy)
        return len(healthy) - leaving, leaving, allowed
    whole: dict[str, list[Obj]] = {}
    for p in healthy:
        whole.setdefault(p["metadata"]["labels"][v.LABEL_GROUP], []).append(p)
    groups = [ps for ps in whole.values() if len(ps) == MULTI_NODE["nodes"]]
    leaving = sum(any(_leaving(p) for p in ps) for ps in groups)
    allowed = disruptions_allowed(budget, len(healthy), len(mine), 0)
    return len(groups) - leaving, leaving, allowed


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize(("before", "after", "multi_node"), [(4, 2, False), (3, 1, True)])
def test_during_a_scale_down_a_drain_keeps_the_floor_and_leaving_pods_count_once(
    seed: int, before: int, after: int, multi_node: bool
) -> None:
    role: EngineRole = "decode"
    shape = {"multiNode": MULTI_NODE} if multi_node else {}
    b = pdd("x").decode(replicas=before, **shape).rollout(drainSeconds=0)
    obj = b.dict()
    obj["metadata"].update(namespace="ns", uid="u-1", generation=1)
    cluster = FakeCluster(obj, rng=random.Random(seed), linger=2)
    rev = compat_revision(PDDeployment.model_validate(obj).spec)
    k = budgets.allowance(RolloutSpec(), grouped=multi_node)
    t = NOW

    def step() -> tuple[int, int, int]:
        nonlocal t
        cluster.reconcile(t)
        cluster.run_pods()
        cluster.place_groups()
        cluster.tick()
        t += 1
        return _drain_view(cluster, "x", rev, role)

    while step()[0] < before:
        assert t < NOW + 200, "never came up"
    revise(cluster, decode={**cluster.body["spec"]["decode"], "replicas": after})
    seen = [step()]
    while seen[-1] != (after, 0, k) or len(cluster.pods_of(f"{rev}-decode")) > after * (
        MULTI_NODE["nodes"] if multi_node else 1
    ):
        seen.append(step())
        assert len(seen) < 60, seen
    for serving, _, allowed in seen:
        # Whatever the drain picks, the pods still serving stay at the floor or above.
        assert serving - min(allowed, serving) >= after - k, seen
        # Leaving pods neither lend a drain their allowance nor take from it: with every kept
        # pod (group) serving, exactly k may go.
        if serving == after:
            assert allowed == k, seen
    assert any(leaving and serving == after for serving, leaving, _ in seen), (
        "the removal gate's leaving pods were never seen beside the kept ones",
        seen,
    )

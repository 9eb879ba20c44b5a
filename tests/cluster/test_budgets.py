"""Disruption budgets on a real API server and disruption controller: one PodDisruptionBudget per
(revision, engine role) selecting exactly its pods; the Eviction API refusing a drain beyond the
allowance; budgets that follow scaling unrewritten; and the operator's own scale-down, paired
rollout and automatic rollback completing with its budgets present and a user's budget that
allows no eviction at all, the retired revisions' budgets gone with them."""

from __future__ import annotations

from builders import compat_revision, pdd
from cluster.kubehelpers import Cluster, budget_counted, evict, pod_ready, wait_for
from kubernetes import client
from operator_harness import (
    READY_DELAY,
    OperatorProcess,
    RolloutWatcher,
    condition,
    create_pdd,
    engine_refusal,
    get_pdd,
    patch_spec,
    ready_after,
    wait_settled,
)
from pdmtp.api import vocabulary as v
from pdmtp.api.vocabulary import EngineRole
from pdmtp.core import names
from pdmtp.core.agreement import check
from pdmtp.core.rollout.steering import target_and_policy

NAME = "budget"
REFUSE = engine_refusal("lookahead mismatch: operator expects 2, vLLM computes 1")


def budgets(cluster: Cluster, namespace: str) -> dict[str, client.V1PodDisruptionBudget]:
    items = client.PolicyV1Api(cluster.api_client).list_namespaced_pod_disruption_budget(namespace)
    return {b.metadata.name: b for b in items.items}


def ours(cluster: Cluster, namespace: str) -> dict[str, client.V1PodDisruptionBudget]:
    return {
        n: b
        for n, b in budgets(cluster, namespace).items()
        if (b.metadata.labels or {}).get(v.LABEL_MANAGED_BY) == v.MANAGED_BY
    }


def expected(revision: str) -> set[str]:
    return {names.disruption_budget(NAME, revision, role) for role in v.ENGINE_ROLES}


def engine_pods(
    cluster: Cluster, namespace: str, revision: str, role: EngineRole
) -> list[client.V1Pod]:
    selector = ",".join(f"{k}={val}" for k, val in names.selector(NAME, revision, role).items())
    items = client.CoreV1Api(cluster.api_client).list_namespaced_pod(
        namespace, label_selector=selector
    )
    return [p for p in items.items if p.metadata.deletion_timestamp is None]


def test_budgets_refuse_a_drain_beyond_the_allowance_and_never_hold_the_operator(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    api = cluster.api_client
    # maxSurge 1, maxUnavailable 0: a drain waits for the operator to move each pod.
    b = ready_after(
        pdd(NAME)
        .mtp(3, modules=3)
        .prefill(replicas=2)
        .decode(replicas=2)
        .rollout(maxSurge=1, maxUnavailable=0, drainSeconds=1)
    )
    create_pdd(api, namespace, b.dict())
    obj = wait_settled(api, namespace, NAME)
    rev = compat_revision(b.build().spec)
    uid = obj["metadata"]["uid"]

    # 1. A budget per engine role of the revision, selecting exactly its pods. The rollout may
    #    surge, so the budgets allow no eviction: the operator moves a drained node's pods.
    found = ours(cluster, namespace)
    assert set(found) == expected(rev)
    for role in v.ENGINE_ROLES:
        budget = found[names.disruption_budget(NAME, rev, role)]
        assert budget.spec.selector.match_labels == names.selector(NAME, rev, role)
        assert budget.spec.max_unavailable == 0 and budget.spec.min_available is None
        assert budget.spec.unhealthy_pod_eviction_policy == "AlwaysAllow"
        assert budget.metadata.owner_references[0].uid == uid
        budget_counted(cluster, namespace, budget.metadata.name, 0, 2)

    # 2. A drain: the node of one prefill pod cordoned, its eviction refused; the operator
    #    brings up a replacement elsewhere, takes the pod out of its routers and removes it.
    core = client.CoreV1Api(api)
    stranded = engine_pods(cluster, namespace, rev, "prefill")[0]
    node = stranded.spec.node_name
    watcher = RolloutWatcher(api, namespace, NAME, target_and_policy(check(b.build().spec))[1])
    watcher.start(b.build().spec)
    core.patch_node(node, {"spec": {"unschedulable": True}})
    try:
        assert evict(cluster, namespace, stranded.metadata.name) == 429
        # The operator killed as the replacement starts: the move goes on from what it observes.
        wait_for(
            lambda: len(engine_pods(cluster, namespace, rev, "prefill")) > 2,
            "a replacement for the cordoned node's prefill",
            30,
        )
        operator.restart()
        wait_for(
            lambda: (
                stranded.metadata.name
                not in {p.metadata.name for p in engine_pods(cluster, namespace, rev, "prefill")}
                and len(ready := engine_pods(cluster, namespace, rev, "prefill")) == 2
                and all(pod_ready(p) and p.spec.node_name != node for p in ready)
            ),
            "the cordoned node's prefill moved off it, replacement first",
            60,
        )
    finally:
        core.patch_node(node, {"spec": {"unschedulable": None}})
    wait_settled(api, namespace, NAME)
    watcher.stop()
    assert watcher.violations == [], (watcher.violations[:5], watcher.views)

    # 2b. An explicit allowance lets a drain evict: one pod, and the next only once the
    #     Deployment's replacement is Ready (it turns Ready 800 ms after it starts). Changing
    #     it rolls nothing.
    b.set(rollout={**b.dict()["spec"]["rollout"], "disruptionBudget": {"maxUnavailable": 1}})
    patch_spec(api, namespace, NAME, b.dict()["spec"])
    prefill = names.disruption_budget(NAME, rev, "prefill")
    budget_counted(cluster, namespace, prefill, 1, 2)
    assert compat_revision(b.build().spec) == rev
    first, second = (p.metadata.name for p in engine_pods(cluster, namespace, rev, "prefill"))
    assert evict(cluster, namespace, first) == 201
    assert evict(cluster, namespace, second) == 429
    budget_counted(cluster, namespace, prefill, 1, 2)
    assert evict(cluster, namespace, second) == 201
    wait_settled(api, namespace, NAME)

    # 3. Scaling follows without a budget rewrite: the controller counts the Deployment's
    #    replicas. Scale-down goes through the removal gate with the budget present.
    generations = {n: x.metadata.generation for n, x in ours(cluster, namespace).items()}
    b.prefill(replicas=3)
    patch_spec(api, namespace, NAME, b.dict()["spec"])
    wait_settled(api, namespace, NAME)
    budget_counted(cluster, namespace, prefill, 1, 3)

    # From here on a user's budget allows no eviction of any of its pods: nothing the operator
    # does is an eviction, so nothing below waits for it.
    strict = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "user-strict"},
        "spec": {"selector": {"matchLabels": {v.LABEL_NAME: NAME}}, "maxUnavailable": 0},
    }
    client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(namespace, strict)
    b.prefill(replicas=1)
    patch_spec(api, namespace, NAME, b.dict()["spec"])
    wait_for(
        lambda: (
            len(engine_pods(cluster, namespace, rev, "prefill")) == 1
            and (o := get_pdd(api, namespace, NAME))["status"].get("prefill") == "1/1"
            and o
        ),
        "scaled down to one prefill",
        60,
    )
    wait_settled(api, namespace, NAME)
    budget_counted(cluster, namespace, prefill, 1, 1)
    assert {n: x.metadata.generation for n, x in ours(cluster, namespace).items()} == generations

    # 4. A paired rollout completes (under the invariant checker); the retired revision's
    #    budgets go with it.
    watcher = RolloutWatcher(api, namespace, NAME, target_and_policy(check(b.build().spec))[1])
    watcher.start(b.build().spec)
    b.mtp(2, modules=3)
    new = compat_revision(b.build().spec)
    watcher.expect(b.build().spec)
    patch_spec(api, namespace, NAME, b.dict()["spec"])
    obj = wait_settled(api, namespace, NAME)
    watcher.stop()
    assert watcher.violations == [], (watcher.violations[:5], watcher.views)
    assert obj["status"]["currentRevision"] == new
    wait_for(lambda: set(ours(cluster, namespace)) == expected(new), "old budgets gone", 20)

    # 5. An automatic rollback (the new revision's engines refuse their config) completes:
    #    the failed revision is removed, budgets and all, and the serving one keeps its own.
    b.mtp(1, modules=3).prefill(podAnnotations={READY_DELAY: "800", **REFUSE})
    failed = compat_revision(b.build().spec)
    patch_spec(api, namespace, NAME, b.dict()["spec"])
    wait_for(
        lambda: (
            (c := condition(get_pdd(api, namespace, NAME), "Progressing"))
            and c["reason"] == "RolloutAborted"
        ),
        "RolloutAborted",
        90,
        0.3,
    )
    wait_for(
        lambda: (
            not [
                p
                for p in client.CoreV1Api(api).list_namespaced_pod(namespace).items
                if p.metadata.labels.get(v.LABEL_REVISION) == failed
            ]
        ),
        "the failed revision's pods gone",
        60,
    )
    wait_for(lambda: set(ours(cluster, namespace)) == expected(new), "failed budgets gone", 20)
    obj = get_pdd(api, namespace, NAME)
    assert obj["status"]["currentRevision"] == new
    assert all(pod_ready(p) for p in engine_pods(cluster, namespace, new, "decode"))
    assert "user-strict" in budgets(cluster, namespace)

"""Multi-node replicas through the real reconcile: rendering, a group as one replica, a member
lost, scaling by groups, and a cluster without the Workload API."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from builders import compat_revision
from pdmtp.api import reasons
from pdmtp.api import vocabulary as v
from pdmtp.api.v1alpha1 import PDDeployment
from pdmtp.core import names
from pdmtp.core.actions import Apply, Delete
from pdmtp.core.agreement import check
from pdmtp.core.groups.grouping import groups_of, units
from pdmtp.core.objects import pod_ready
from pdmtp.core.promtext import Scrape
from pdmtp.core.reconcile import decide
from pdmtp.core.render.children import RevisionReplicas, revision_children
from pdmtp.core.windows import PodMetrics

from tests.support.fake_cluster import FakeCluster

Obj = dict[str, Any]
NOW = 1_800_000_000.0

BODY: Obj = {
    "apiVersion": "pdmtp.io/v1alpha1",
    "kind": "PDDeployment",
    "metadata": {"name": "ds", "namespace": "serving", "uid": "u-1", "generation": 1},
    "spec": {
        "model": {"name": "deepseek-ai/DeepSeek-V3", "mtpModules": 1},
        "image": "pdmtp-engine:dev",
        "speculative": {"method": "mtp", "numSpeculativeTokens": 1},
        "prefill": {"replicas": 1, "tensorParallelSize": 8},
        "decode": {
            "replicas": 2,
            "multiNode": {
                "nodes": 2,
                "layout": "DataParallel",
                "dataParallelSize": 16,
                "expertParallel": True,
                "topologyKey": "topology.pdmtp.io/rack",
            },
        },
    },
}


def _revision(body: Obj) -> str:
    return compat_revision(PDDeployment.model_validate(body).spec)


def _cluster() -> FakeCluster:
    return FakeCluster(copy.deepcopy(BODY))


def _settle(cluster: FakeCluster, rounds: int = 8) -> None:
    for i in range(rounds):
        cluster.reconcile(NOW + i)
        cluster.run_pods()
        cluster.place_groups()


def _decode_pods(cluster: FakeCluster) -> list[Obj]:
    return [p for p in cluster.pods.values() if p["metadata"]["labels"][v.LABEL_ROLE] == "decode"]


def _router_args(cluster: FakeCluster) -> list[str]:
    rev = _revision(BODY)
    router = cluster.objects[f"Deployment/{names.workload('ds', rev, 'router')}"]
    return list(router["spec"]["template"]["spec"]["containers"][0]["args"])


def test_a_group_renders_a_gang_its_ranks_and_a_headless_service() -> None:
    pdd = PDDeployment.model_validate(BODY)
    rev = _revision(BODY)
    children = revision_children(pdd, rev, RevisionReplicas(1, 2, 1), check(pdd.spec), None)
    kinds = [(c["kind"], c["metadata"]["name"]) for c in children]
    assert ("Deployment", f"ds-{rev}-prefill") in kinds
    assert ("Deployment", f"ds-{rev}-decode") not in kinds
    assert ("Service", f"ds-{rev}-decode") in kinds
    groups = [c for c in children if c["kind"] == "PodGroup"]
    assert [g["metadata"]["name"] for g in groups] == [f"ds-{rev}-decode-g0", f"ds-{rev}-decode-g1"]
    assert groups[0]["spec"] == {
        "schedulingPolicy": {"gang": {"minCount": 2}},
        "schedulingConstraints": {"topology": [{"key": "topology.pdmtp.io/rack"}]},
    }
    pods = {c["metadata"]["name"]: c for c in children if c["kind"] == "Pod"}
    leader, worker = pods[f"ds-{rev}-decode-g0-0"], pods[f"ds-{rev}-decode-g0-1"]
    address = f"g0-0.ds-{rev}-decode.serving.svc"
    for pod, rank in ((leader, 0), (worker, 1)):
        spec = pod["spec"]
        args = spec["containers"][0]["args"]
        assert spec["schedulingGroup"] == {"podGroupName": f"ds-{rev}-decode-g0"}
        assert spec["hostname"] == f"g0-{rank}" and spec["subdomain"] == f"ds-{rev}-decode"
        assert args[args.index("--data-parallel-size") + 1] == "16"
        assert args[args.index("--data-parallel-size-local") + 1] == "8"
        assert args[args.index("--data-parallel-address") + 1] == address
        assert "--enable-expert-parallel" in args
        assert spec["containers"][0]["resources"]["limits"][v.GPU_RESOURCE] == 8
        env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
        assert env[v.ENV_GROUP_RANK] == str(rank) and env[v.ENV_LEADER_ADDRESS] == address
        assert pod["metadata"]["labels"][v.LABEL_GROUP_RANK] == str(rank)
    worker_args = worker["spec"]["containers"][0]["args"]
    assert "--headless" in worker_args
    assert worker_args[worker_args.index("--data-parallel-start-rank") + 1] == "8"
    assert "--headless" not in leader["spec"]["containers"][0]["args"]
    assert "readinessProbe" in leader["spec"]["containers"][0]
    assert "readinessProbe" not in worker["spec"]["containers"][0]


def test_tensor_parallel_groups_split_the_world_over_nodes() -> None:
    body = copy.deepcopy(BODY)
    body["spec"]["decode"] = {
        "replicas": 1,
        "tensorParallelSize": 16,
        "multiNode": {"nodes": 2, "layout": "TensorParallel"},
    }
    body["spec"]["prefill"]["tensorParallelSize"] = 16
    pdd = PDDeployment.model_validate(body)
    rev = _revision(body)
    children = revision_children(pdd, rev, RevisionReplicas(1, 1, 1), check(pdd.spec), None)
    pods = [c for c in children if c["kind"] == "Pod"]
    assert len(pods) == 2
    for rank, pod in enumerate(pods):
        args = pod["spec"]["containers"][0]["args"]
        assert args[args.index("--nnodes") + 1] == "2"
        assert args[args.index("--node-rank") + 1] == str(rank)
        assert args[args.index("--master-port") + 1] == str(v.MASTER_PORT)
        assert ("--headless" in args) == (rank > 0)
        assert pod["spec"]["containers"][0]["resources"]["requests"][v.GPU_RESOURCE] == 8


def test_groups_come_up_whole_and_only_leaders_are_routed() -> None:
    cluster = _cluster()
    first = cluster.reconcile(NOW)
    created = [a.key for a in first.actions if isinstance(a, Apply)]
    rev = _revision(BODY)
    assert f"PodGroup/ds-{rev}-decode-g0" in created and f"Pod/ds-{rev}-decode-g1-1" in created
    _settle(cluster)
    decode = _decode_pods(cluster)
    assert len(decode) == 4 and all(pod_ready(p) for p in decode)
    args = _router_args(cluster)
    decodes = [args[i + 1] for i, a in enumerate(args) if a == "--decode"]
    leaders = sorted(
        f"http://{p['status']['podIP']}:8000"
        for p in decode
        if p["metadata"]["labels"][v.LABEL_GROUP_RANK] == "0"
    )
    assert sorted(decodes) == leaders
    status = cluster.body["status"]
    # Counted in groups: the printer column and the role entry say 2 of 2 replicas.
    assert status["decode"] == "2/2"
    decode_entry = next(r for r in status["roles"] if r["name"] == "decode")
    assert decode_entry["readyReplicas"] == decode_entry["desiredReplicas"] == 2
    assert decode_entry["podsPerReplica"] == 2
    assert "podsPerReplica" not in next(r for r in status["roles"] if r["name"] == "prefill")
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Available"]["status"] == "True"


def test_a_group_is_not_ready_while_one_member_is_not() -> None:
    cluster = _cluster()
    _settle(cluster)
    rev = _revision(BODY)
    worker = cluster.pods[f"ds-{rev}-decode-g0-1"]
    worker["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    folded = units(list(cluster.pods.values()), [])
    g0 = next(u for u in folded if u["metadata"]["name"] == f"ds-{rev}-decode-g0-0")
    assert not pod_ready(g0)
    cluster.reconcile(NOW + 100)
    args = _router_args(cluster)
    leader_ip = cluster.pods[f"ds-{rev}-decode-g0-0"]["status"]["podIP"]
    assert f"http://{leader_ip}:8000" not in args


def test_a_lost_member_replaces_its_group_whole_under_a_new_gang() -> None:
    cluster = _cluster()
    _settle(cluster)
    rev = _revision(BODY)
    del cluster.pods[f"ds-{rev}-decode-g1-1"]
    decision = cluster.reconcile(NOW + 100)
    deleted = {a.key for a in decision.actions if isinstance(a, Delete)}
    assert deleted == {f"PodGroup/ds-{rev}-decode-g1", f"Pod/ds-{rev}-decode-g1-0"}
    created = {a.key for a in decision.actions if isinstance(a, Apply)}
    # g1's id is free again once none of its objects is left; a new id is never a live one.
    assert f"PodGroup/ds-{rev}-decode-g1" not in created or f"Pod/ds-{rev}-decode-g1-0" in deleted
    events = [e for e in decision.events if e.reason == reasons.GROUP_REMOVED]
    assert events and "is gone" in events[0].message
    _settle(cluster)
    assert sum(pod_ready(u) for u in units(_decode_pods(cluster), [])) == 2


def test_a_restarted_rank_breaks_its_group() -> None:
    cluster = _cluster()
    _settle(cluster)
    rev = _revision(BODY)
    cluster.pods[f"ds-{rev}-decode-g0-1"]["status"]["containerStatuses"] = [
        {"name": "engine", "restartCount": 1}
    ]
    decision = cluster.reconcile(NOW + 100)
    deleted = {a.key for a in decision.actions if isinstance(a, Delete)}
    assert f"PodGroup/ds-{rev}-decode-g0" in deleted


def test_scaling_adds_and_removes_whole_groups() -> None:
    cluster = _cluster()
    _settle(cluster)
    cluster.body["spec"]["decode"]["replicas"] = 3
    cluster.body["metadata"]["generation"] = 2
    _settle(cluster)
    assert len(_decode_pods(cluster)) == 6
    cluster.body["spec"]["decode"]["replicas"] = 1
    cluster.body["metadata"]["generation"] = 3
    _settle(cluster, rounds=12)
    decode = _decode_pods(cluster)
    assert len(decode) == 2
    assert len({p["metadata"]["labels"][v.LABEL_GROUP] for p in decode}) == 1
    found = groups_of(decode, [o for o in cluster.objects.values() if o["kind"] == "PodGroup"])
    assert len(found) == 1 and found[0].complete


def test_without_the_workload_api_a_multi_node_spec_is_refused_and_nothing_created() -> None:
    cluster = _cluster()
    cluster.workload_api = None
    decision = cluster.reconcile(NOW)
    assert decision.actions == ()
    condition = next(
        c for c in cluster.body["status"]["conditions"] if c["type"] == reasons.CONFIG_COMPATIBLE
    )
    assert condition["status"] == "False"
    assert condition["reason"] == reasons.WORKLOAD_API_UNAVAILABLE
    assert "GenericWorkload" in condition["message"]


def _autoscale_round(cluster: FakeCluster, now: float, leader_kv: float) -> None:
    """One reconcile with every decode pod scraped: leaders at `leader_kv`, workers idle (a
    worker's engine serves no request of its own; were it a source, it would halve the mean)."""
    metrics = {
        p["metadata"]["name"]: PodMetrics(
            Scrape(now, kv_cache_usage=kv, running=1.0), Scrape(now - 15, kv_cache_usage=kv)
        )
        for p in _decode_pods(cluster)
        for kv in [leader_kv if p["metadata"]["labels"][v.LABEL_GROUP_RANK] == "0" else 0.0]
    }
    decision = decide(replace(cluster.observed(), metrics=metrics), now)
    cluster.apply(decision)
    if decision.status_changed:
        cluster.body["status"] = copy.deepcopy(decision.status)
    cluster.run_pods()
    cluster.place_groups()


def test_the_autoscaler_counts_groups_and_reads_their_leaders() -> None:
    """kvCacheUsage at twice its target on the leaders of 2 decode groups: 4 groups (8 pods);
    then quiet: down to minReplicas, one whole group. The workers' idle scrapes count for
    nothing (were they sources, the mean would sit on the target and nothing would move)."""
    cluster = _cluster()
    cluster.body["spec"]["autoscaling"] = {
        "intervalSeconds": 15,
        "decode": {
            "minReplicas": 1,
            "maxReplicas": 4,
            "targets": [{"signal": "kvCacheUsage", "value": 0.5}],
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 0},
                "scaleDown": {"stabilizationWindowSeconds": 0},
            },
        },
    }
    _settle(cluster)
    now = NOW + 100
    for _ in range(12):
        now += 16
        _autoscale_round(cluster, now, leader_kv=1.0)
    decode = _decode_pods(cluster)
    assert len({p["metadata"]["labels"][v.LABEL_GROUP] for p in decode}) == 4 and len(decode) == 8
    roles = {r["name"]: r for r in cluster.body["status"]["autoscaling"]["roles"]}
    assert roles["decode"]["desiredReplicas"] == 4, roles
    assert cluster.body["status"]["decode"] == "4/4"
    for _ in range(30):
        now += 16
        _autoscale_round(cluster, now, leader_kv=0.05)
    decode = _decode_pods(cluster)
    found = groups_of(decode, [o for o in cluster.objects.values() if o["kind"] == "PodGroup"])
    assert len(decode) == 2 and len(found) == 1 and found[0].complete
    assert cluster.body["status"]["decode"] == "1/1"

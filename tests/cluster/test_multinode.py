"""Multi-node roles on a real API server and kube-scheduler (the Workload API's gang), with the
operator as a subprocess: groups come up whole, a member evicted by a drain replaces its group
and the router follows while the role's disruption budget refuses a second group, a paired
rollout of multi-node prefill and decode (an operator kill mid-roll included) keeps every
invariant and never binds a group partly, and scaling adds and removes whole groups, by the spec
and by `kubectl scale pdrolescale`, the budget following the group count."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from builders import PDDBuilder, pdd
from cluster.gangwatch import GangNodes, GangWatch, served_podgroup_version
from cluster.kubehelpers import (
    Cluster,
    budget_counted,
    evict,
    install_crd,
    kubectl,
    wait_for,
)
from kubernetes import client, config
from localcluster import RACK_LABEL, LocalCluster
from operator_harness import (
    OperatorProcess,
    RolloutWatcher,
    condition,
    create_pdd,
    get_pdd,
    patch_spec,
    ready_after,
    wait_settled,
)
from pdmtp.api import reasons
from pdmtp.api import vocabulary as v
from pdmtp.core import names
from pdmtp.core.agreement import check
from pdmtp.core.objects import engine_url
from pdmtp.core.render.membership import router_urls
from pdmtp.core.rollout.steering import target_and_policy
from pdmtp.kube import Kube

REPO = Path(__file__).resolve().parents[2]

GROUP_SHAPE = {"nodes": 2, "layout": "TensorParallel"}


def _multi_node(name: str) -> PDDBuilder:
    """Both roles span two nodes (TP 2 split over 2 pods of 1 GPU), quick to become Ready."""
    b = pdd(name).mtp(3, modules=3)
    b.prefill(replicas=1, tensorParallelSize=2, multiNode=dict(GROUP_SHAPE))
    b.decode(replicas=2, tensorParallelSize=2, multiNode=dict(GROUP_SHAPE))
    b.rollout(maxSurge=1, maxUnavailable=0, drainSeconds=1)
    return ready_after(b, 300)


@pytest.fixture
def served(cluster: Cluster) -> str:
    version = served_podgroup_version(cluster.api_client)
    if version is None:
        pytest.fail("the local control plane must serve the Workload API (scheduling.k8s.io)")
    return version


@pytest.fixture
def plain_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A control plane of its own without the Workload API (as most clusters are today)."""
    local = LocalCluster(tmp_path / "plain", nodes=1, die_with_parent=True, gang_scheduling=False)
    local.start()
    api = config.new_client_from_config(config_file=str(local.kubeconfig))
    try:
        install_crd(api, REPO / "crds" / "pdmtp.io_pddeployments.yaml")
        install_crd(api, REPO / "crds" / "pdmtp.io_pdrolescales.yaml")
        yield Cluster(local.kubeconfig, api, "local", local)
    finally:
        api.close()
        local.stop()


def _raw_pods(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    # Raw JSON: the typed client has no schedulingGroup and would drop it.
    api = cluster.api_client
    method, url, headers, _, _ = api.param_serialize(
        "GET",
        f"/api/v1/namespaces/{namespace}/pods",
        query_params=[("labelSelector", f"{v.LABEL_NAME}={name}")],
        auth_settings=["BearerToken"],
    )
    items: list[dict[str, Any]] = json.loads(
        api.call_api(method, url, header_params=headers).read()
    )["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def _groups(pods: list[dict[str, Any]], role: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for p in pods:
        labels = p["metadata"]["labels"]
        if labels.get(v.LABEL_ROLE) == role and v.LABEL_GROUP in labels:
            out.setdefault(labels[v.LABEL_GROUP], []).append(p)
    return out


def _listed(pods: list[dict[str, Any]]) -> set[str]:
    urls: set[str] = set()
    for p in pods:
        if p["metadata"]["labels"].get(v.LABEL_ROLE) == "router":
            urls |= router_urls(p["spec"]["containers"][0].get("args") or [])
    return urls


def _leaders(pods: list[dict[str, Any]], role: str) -> set[str]:
    return {
        engine_url(p["status"]["podIP"])
        for members in _groups(pods, role).values()
        for p in members
        if p["metadata"]["labels"][v.LABEL_GROUP_RANK] == "0" and p["status"].get("podIP")
    }


def _routed_leaders(cluster: Cluster, namespace: str, name: str) -> None:
    """Every router lists exactly the leaders of its revision's groups (no worker)."""

    def probe() -> bool:
        pods = _raw_pods(cluster, namespace, name)
        routers = [p for p in pods if p["metadata"]["labels"].get(v.LABEL_ROLE) == "router"]
        leaders = _leaders(pods, "prefill") | _leaders(pods, "decode")
        return bool(routers) and all(
            router_urls(r["spec"]["containers"][0].get("args") or []) == leaders for r in routers
        )

    wait_for(probe, "routers list exactly the group leaders", 60, interval=0.5)


def test_groups_serve_whole_recover_whole_roll_and_scale_by_groups(
    cluster: Cluster, namespace: str, operator: OperatorProcess, served: str
) -> None:
    b = _multi_node("wide")
    create_pdd(cluster.api_client, namespace, b.dict())
    obj = wait_settled(cluster.api_client, namespace, "wide", 120)
    assert (obj["status"]["prefill"], obj["status"]["decode"]) == ("1/1", "2/2")

    # Whole groups, each with its gang, one pod per node.
    pods = _raw_pods(cluster, namespace, "wide")
    decode = _groups(pods, "decode")
    assert len(decode) == 2 and all(len(members) == 2 for members in decode.values())
    for members in decode.values():
        assert len({p["spec"]["nodeName"] for p in members}) == 2
        assert len({p["spec"]["schedulingGroup"]["podGroupName"] for p in members}) == 1
    _routed_leaders(cluster, namespace, "wide")

    # (c) A worker evicted (a drain): its group is replaced whole (a new gang) and the router
    #     follows. The role's budget counts pods of whole groups (the PDDeployment owns them,
    #     which has no scale subresource: minAvailable, not maxUnavailable, core/render/budgets.py):
    #     it allows one pod, so one group, and refuses a member of the other group meanwhile.
    revision = obj["status"]["currentRevision"]
    budget = names.disruption_budget("wide", revision, "decode")
    assert budget_counted(cluster, namespace, budget, 1, 4).spec.min_available == 3
    (lost_group, members), (_, others) = sorted(decode.items())
    worker = next(p for p in members if p["metadata"]["labels"][v.LABEL_GROUP_RANK] == "1")
    assert evict(cluster, namespace, worker["metadata"]["name"]) == 201
    started = time.monotonic()
    assert evict(cluster, namespace, others[0]["metadata"]["name"]) == 429

    def replaced() -> bool:
        now = _groups(_raw_pods(cluster, namespace, "wide"), "decode")
        complete = [g for g, m in now.items() if len(m) == 2 and all(_ready(p) for p in m)]
        return lost_group not in now and len(complete) == 2

    wait_for(replaced, f"group {lost_group} replaced whole", 90, interval=0.3)
    recovery = time.monotonic() - started
    wait_settled(cluster.api_client, namespace, "wide", 60)
    _routed_leaders(cluster, namespace, "wide")
    removed = [
        e
        for e in client.CoreV1Api(cluster.api_client).list_namespaced_event(namespace).items
        if e.reason == reasons.GROUP_REMOVED
    ]
    assert any(lost_group in (e.message or "") and "is gone" in e.message for e in removed)
    print(f"group {lost_group} replaced and serving again in {recovery:.1f}s")

    # (d) A paired rollout of both multi-node roles, the operator killed mid-roll.
    spec = b.build().spec
    watcher = RolloutWatcher(
        cluster.api_client, namespace, "wide", target_and_policy(check(spec))[1]
    )
    watcher.start(spec)
    gangs = GangWatch(
        cluster.api_client, namespace, f"{v.LABEL_NAME}=wide", podgroup_version=None
    ).start()
    b.mtp(2, modules=2)
    watcher.expect(b.build().spec)
    patch_spec(cluster.api_client, namespace, "wide", b.dict()["spec"])
    wait_for(
        lambda: len(_raw_pods(cluster, namespace, "wide")) > len(pods),
        "the new revision's first group",
        60,
        interval=0.2,
    )
    operator.kill()
    time.sleep(1)
    operator.start()
    obj = wait_settled(cluster.api_client, namespace, "wide", 180)
    watcher.stop()
    gangs.stop()
    assert watcher.violations == [], (watcher.violations[:5], watcher.views)
    assert gangs.violations() == [], gangs.report()
    new_revision = obj["status"]["currentRevision"]
    pods = _raw_pods(cluster, namespace, "wide")
    assert {p["metadata"]["labels"][v.LABEL_REVISION] for p in pods} == {new_revision}
    _routed_leaders(cluster, namespace, "wide")

    # (e) Scaling adds and removes whole groups: by the spec, then through the PDRoleScale.
    b.decode(replicas=3)
    patch_spec(cluster.api_client, namespace, "wide", b.dict()["spec"])
    wait_for(
        lambda: get_pdd(cluster.api_client, namespace, "wide")["status"]["decode"] == "3/3",
        "decode at 3 groups",
        90,
    )
    assert len(_groups(_raw_pods(cluster, namespace, "wide"), "decode")) == 3
    b.set(autoscaling={"decode": {"source": "External", "minReplicas": 1, "maxReplicas": 4}})
    patch_spec(cluster.api_client, namespace, "wide", b.dict()["spec"])
    wait_for(
        lambda: (
            kubectl(cluster, "get", "pdrolescale", "wide-decode", "-n", namespace).returncode == 0
        ),
        "the decode PDRoleScale",
        30,
    )
    done = kubectl(cluster, "scale", "pdrolescale/wide-decode", "--replicas=1", "-n", namespace)
    assert done.returncode == 0, done.stderr

    def one_group() -> bool:
        groups = _groups(_raw_pods(cluster, namespace, "wide"), "decode")
        return len(groups) == 1 and all(len(m) == 2 for m in groups.values())

    wait_for(one_group, "decode scaled to one whole group", 90, interval=0.3)
    obj = wait_settled(cluster.api_client, namespace, "wide", 60)
    assert obj["status"]["decode"] == "1/1"
    _routed_leaders(cluster, namespace, "wide")
    # The budget followed the group count; the retired revision's went with it.
    budget = names.disruption_budget("wide", new_revision, "decode")
    assert budget_counted(cluster, namespace, budget, 1, 2).spec.min_available == 1
    live = client.PolicyV1Api(cluster.api_client).list_namespaced_pod_disruption_budget(namespace)
    assert {b.metadata.name for b in live.items} == {
        names.disruption_budget("wide", new_revision, role) for role in v.ENGINE_ROLES
    }


def _ready(pod: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def test_a_group_waits_whole_for_nodes_in_one_rack_and_the_status_says_so(
    cluster: Cluster, namespace: str, operator: OperatorProcess, served: str
) -> None:
    """(a) and (b) through the operator: a decode group of two 8-GPU pods that must share a
    rack, on the test's own nodes. One free node in each rack: no pod of the group is bound at
    any watch event, and the status names what waits. A second node in one rack: the whole
    group binds there, and the PDDeployment becomes Available."""
    nodes = GangNodes(cluster.api_client)
    try:
        nodes.add("rack-a")
        nodes.add("rack-b")
        b = pdd("racked").mtp(3, modules=3).prefill(replicas=1)
        b.decode(
            replicas=1,
            tensorParallelSize=16,
            multiNode={"nodes": 2, "layout": "TensorParallel", "topologyKey": RACK_LABEL},
            nodeSelector=nodes.node_selector,
            tolerations=[nodes.toleration],
        )
        selector = f"{v.LABEL_NAME}=racked,{v.LABEL_ROLE}=decode"
        with GangWatch(cluster.api_client, namespace, selector, node_label=RACK_LABEL) as gangs:
            create_pdd(cluster.api_client, namespace, b.dict())

            def waiting() -> Any:
                obj = get_pdd(cluster.api_client, namespace, "racked")
                found = condition(obj, "Progressing")
                return (
                    found
                    and "racked-" in found["message"]
                    and "decode-g0" in found["message"]
                    and found
                )

            said = wait_for(waiting, "the status names the waiting group's pods", 60, 0.3)
            assert said["reason"] == reasons.PODS_UNSCHEDULABLE, said
            time.sleep(3)
            assert all(s.bound == 0 for o in gangs.history() for s in o.groups.values())
            nodes.add("rack-b")
            wait_settled(cluster.api_client, namespace, "racked", 60)
        assert gangs.violations() == [], gangs.report()
        decode = _raw_pods(cluster, namespace, "racked")
        placed = {
            p["spec"]["nodeName"]
            for p in decode
            if p["metadata"]["labels"][v.LABEL_ROLE] == "decode"
        }
        assert placed == set(nodes.names[1:]), (placed, nodes.names)
    finally:
        client.CustomObjectsApi(cluster.api_client).delete_namespaced_custom_object(
            v.GROUP, v.VERSION, namespace, v.PLURAL, "racked"
        )
        wait_for(
            lambda: (
                not [
                    p
                    for p in client.CoreV1Api(cluster.api_client)
                    .list_namespaced_pod(namespace)
                    .items
                    if p.spec.node_name in nodes.names
                ]
            ),
            "the group's pods gone",
            60,
        )
        nodes.delete()


def test_discovery_finds_the_served_workload_api(cluster: Cluster, served: str) -> None:
    kube = Kube(cluster.api_client)
    group, plural = v.WORKLOAD_API_GROUP, v.POD_GROUP_PLURAL
    assert kube.served_version(group, v.WORKLOAD_API_VERSIONS, plural) == served
    assert kube.served_version(group, ("v9",), plural) is None
    assert kube.served_version("nothing.example.com", ("v1",), plural) is None


def test_without_the_workload_api_a_multi_node_spec_is_refused_and_single_node_serves(
    plain_cluster: Cluster, tmp_path: Path
) -> None:
    """No half gang where the scheduler cannot gang: the multi-node spec gets a clear condition
    and no pod; a single-node PDDeployment beside it becomes Available."""
    api, namespace = plain_cluster.api_client, "plain"
    assert served_podgroup_version(api) is None
    client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
    op = OperatorProcess(plain_cluster.kubeconfig, [namespace], tmp_path / "operator.log")
    op.start()
    try:
        create_pdd(api, namespace, _multi_node("wide").dict())
        create_pdd(api, namespace, pdd("narrow").mtp(3, modules=3).dict())

        def refused() -> Any:
            found = condition(get_pdd(api, namespace, "wide"), reasons.CONFIG_COMPATIBLE)
            return found and found["status"] == "False" and found

        said = wait_for(refused, "the multi-node spec refused", 60, interval=0.3)
        assert said["reason"] == reasons.WORKLOAD_API_UNAVAILABLE, said
        assert "GenericWorkload" in said["message"] and "multiNode" in said["message"]
        wait_settled(api, namespace, "narrow", 60)
        pods = client.CoreV1Api(api).list_namespaced_pod(namespace).items
        assert not [p.metadata.name for p in pods if p.metadata.name.startswith("wide-")]
    finally:
        op.stop()

"""Kubernetes' own gang scheduling (the Workload API's PodGroup) on the real kube-scheduler: the
facts the operator builds on, shown with raw PodGroup and Pod manifests (no operator).

- A gang of two 8-GPU pods binds all or nothing: with one free node neither binds (at every
  watch event), a second node binds both. The PodGroup says so: its scheduled condition
  (SCHEDULED_CONDITION) is False/Unschedulable, then True/Scheduled.
- A gang with a topology constraint on the rack label never spans racks, even when one free node
  in each rack would fit it.
- Controls, so the checks can fail: the same pods without a PodGroup bind one by one, and the
  same gang without the topology constraint spans the racks.

Isolation: each test registers its own KWOK nodes (a label unique to the test, which the pods
select, and a taint only they tolerate, so no other test's pods land there) and deletes them and
its pods afterwards; the session's shared nodes are never counted on.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from cluster.gangwatch import (
    SCHEDULED_CONDITION,
    SCHEDULING_GROUP,
    GangNodes,
    GangWatch,
    GroupState,
    served_podgroup_version,
)
from cluster.kubehelpers import Cluster, wait_for
from kubernetes import client
from localcluster import GPU_RESOURCE, RACK_LABEL, workload_api

IMAGE = "registry.invalid/pdmtp/fake:0"
APP = "gang-test"
SETTLE = 2.0  # how long a gang's two bind calls may leave it partly bound (~ms in practice)
HOLD = SETTLE + 1.0  # how long a refused state is watched before capacity is added


@pytest.fixture(scope="module")
def podgroup_version(cluster: Cluster) -> str:
    version = served_podgroup_version(cluster.api_client)
    if version is None:
        pytest.skip(
            "the cluster does not serve scheduling.k8s.io PodGroups (the Workload API is off; "
            "hack/lib/localcluster.py workload_api() switches it on for the local cluster)"
        )
    api = workload_api()
    if cluster.local is not None and api is not None:
        assert version == api.version, f"served {version}, localcluster expects {api.version}"
    return version


@dataclass
class GangEnv:
    """The test's own nodes, PodGroups and pods in `namespace`."""

    api: client.ApiClient
    namespace: str
    podgroup_version: str
    nodes: GangNodes = field(init=False)

    def __post_init__(self) -> None:
        self.nodes = GangNodes(self.api)

    @property
    def tag(self) -> str:
        return self.nodes.tag

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def selector(self) -> str:
        return f"app={APP}"

    def add_node(self, rack: str) -> str:
        return self.nodes.add(rack)

    def podgroup(self, name: str, min_count: int, topology: bool = False) -> None:
        spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": min_count}}}
        if topology:
            spec["schedulingConstraints"] = {"topology": [{"key": RACK_LABEL}]}
        body = {
            "apiVersion": f"{SCHEDULING_GROUP}/{self.podgroup_version}",
            "kind": "PodGroup",
            "metadata": {"name": name},
            "spec": spec,
        }
        client.CustomObjectsApi(self.api).create_namespaced_custom_object(
            SCHEDULING_GROUP, self.podgroup_version, self.namespace, "podgroups", body
        )

    def podgroup_scheduled(self, name: str) -> tuple[str, str] | None:
        """(status, reason) of the PodGroup's scheduled condition, None while it has none."""
        pg = client.CustomObjectsApi(self.api).get_namespaced_custom_object(
            SCHEDULING_GROUP, self.podgroup_version, self.namespace, "podgroups", name
        )
        kind = SCHEDULED_CONDITION.get(self.podgroup_version)
        for condition in pg.get("status", {}).get("conditions", []):
            if condition["type"] == kind:
                return condition["status"], condition["reason"]
        return None

    def pod(self, name: str, group: str, podgroup: bool = True) -> None:
        """An 8-GPU pod for this test's nodes; in PodGroup `group` when `podgroup`, else only
        labelled gang=`group`."""
        spec: dict[str, Any] = {
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": self.nodes.node_selector,
            "tolerations": [self.nodes.toleration],
            "containers": [
                {"name": "engine", "image": IMAGE, "resources": {"limits": {GPU_RESOURCE: "8"}}}
            ],
        }
        if podgroup:
            spec["schedulingGroup"] = {"podGroupName": group}
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": APP, "gang": group}},
            "spec": spec,
        }
        self.core.create_namespaced_pod(self.namespace, body)

    def wait_refused(self, names: list[str], timeout: float = 30) -> None:
        """Until the scheduler has tried every pod of `names` and reported it Unschedulable."""

        def refused(name: str) -> bool:
            conditions = self.core.read_namespaced_pod(name, self.namespace).status.conditions
            return any(
                c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conditions or []
            )

        wait_for(lambda: all(refused(n) for n in names), f"{names} Unschedulable", timeout)

    def node_of(self, pod: str) -> str:
        return str(self.core.read_namespaced_pod(pod, self.namespace).spec.node_name)

    def events(self) -> list[str]:
        return [
            f"{e.involved_object.kind}/{e.involved_object.name} {e.type} {e.reason}: {e.message}"
            for e in self.core.list_namespaced_event(self.namespace).items
        ]

    def cleanup(self) -> None:
        core = self.core
        core.delete_collection_namespaced_pod(
            self.namespace, label_selector=self.selector, grace_period_seconds=0
        )

        def gone() -> bool:
            return not core.list_namespaced_pod(self.namespace, label_selector=self.selector).items

        wait_for(gone, "test pods deleted", 30)
        self.nodes.delete()


@pytest.fixture
def env(cluster: Cluster, namespace: str, podgroup_version: str) -> Iterator[GangEnv]:
    gang = GangEnv(cluster.api_client, namespace, podgroup_version)
    try:
        yield gang
    finally:
        gang.cleanup()


def bound(group: str, count: int) -> Any:
    def check(groups: dict[str, GroupState]) -> bool:
        state = groups.get(group)
        return state is not None and state.bound == count

    return check


def hold(watcher: GangWatch) -> list[int]:
    """Watch a refused state for HOLD seconds; the bound counts of every observation so far."""
    time.sleep(HOLD)
    return [s.bound for o in watcher.history() for s in o.groups.values()]


def bind_figures(watcher: GangWatch, pods: list[str], capacity_at: float) -> str:
    times = [watcher.bound_at[p] for p in pods]
    return (
        f"bound {max(times) - capacity_at:.3f}s after the node was created, "
        f"{(max(times) - min(times)) * 1000:.0f} ms apart"
    )


def test_fake_nodes_are_split_into_two_racks(cluster: Cluster) -> None:
    if cluster.local is None:
        pytest.skip(f"{cluster.backend} cluster: the racks are the local control plane's")
    nodes = client.CoreV1Api(cluster.api_client).list_node().items
    racks = {
        n.metadata.name: (n.metadata.labels or {}).get(RACK_LABEL)
        for n in nodes
        if n.metadata.name in cluster.local.node_names()
    }
    assert sorted(racks.values()) == ["rack-a", "rack-a", "rack-b", "rack-b"], racks


def test_gang_binds_all_members_or_none(env: GangEnv) -> None:
    env.add_node("rack-a")
    env.podgroup("pg", min_count=2)
    with GangWatch(env.api, env.namespace, env.selector, settle=SETTLE) as watcher:
        env.pod("pg-0", "pg")
        env.pod("pg-1", "pg")
        env.wait_refused(["pg-0", "pg-1"])
        refused = ("False", "Unschedulable")
        wait_for(lambda: env.podgroup_scheduled("pg") == refused, f"PodGroup {refused}", 30)
        counts = hold(watcher)
        assert counts and set(counts) == {0}, watcher.report()

        capacity_at = watcher.elapsed()
        env.add_node("rack-a")
        watcher.wait(bound("pg", 2), "both members bound", 60)
    assert not watcher.violations(), watcher.report()
    scheduled = ("True", "Scheduled")
    wait_for(lambda: env.podgroup_scheduled("pg") == scheduled, f"PodGroup {scheduled}", 30)
    assert watcher.latest()["pg"] == GroupState(2, 2, 2, frozenset())
    assert env.node_of("pg-0") != env.node_of("pg-1")
    print(
        f"\ngang: {bind_figures(watcher, ['pg-0', 'pg-1'], capacity_at)}; "
        f"partly bound meanwhile: {watcher.transient_partials()}\n" + "\n".join(env.events())
    )


def test_gang_with_rack_topology_never_spans_racks(env: GangEnv) -> None:
    # One free node in each rack: enough GPUs for the gang, but only across two racks.
    env.add_node("rack-a")
    env.add_node("rack-b")
    env.podgroup("pg", min_count=2, topology=True)
    with GangWatch(
        env.api, env.namespace, env.selector, node_label=RACK_LABEL, settle=SETTLE
    ) as watcher:
        env.pod("pg-0", "pg")
        env.pod("pg-1", "pg")
        env.wait_refused(["pg-0", "pg-1"])
        counts = hold(watcher)
        assert counts and set(counts) == {0}, watcher.report()

        capacity_at = watcher.elapsed()
        env.add_node("rack-b")
        watcher.wait(bound("pg", 2), "both members bound", 60)
    assert not watcher.violations(), watcher.report()
    assert watcher.latest()["pg"].domains == {"rack-b"}
    print(f"\nrack gang: {bind_figures(watcher, ['pg-0', 'pg-1'], capacity_at)}")


def test_control_pods_without_podgroup_bind_one_by_one(env: GangEnv) -> None:
    env.add_node("rack-a")
    with GangWatch(
        env.api, env.namespace, env.selector, group_label="gang", sizes={"ctl": 2}, settle=SETTLE
    ) as watcher:
        env.pod("ctl-0", "ctl", podgroup=False)
        env.pod("ctl-1", "ctl", podgroup=False)
        watcher.wait(bound("ctl", 1), "one pod bound", 30)
        time.sleep(HOLD)  # the other waits for a node while the first holds one
        assert watcher.latest()["ctl"].bound == 1, watcher.report()
        env.add_node("rack-a")
        watcher.wait(bound("ctl", 2), "both pods bound", 60)
    assert watcher.partly_bound(), watcher.report()
    assert not watcher.spans()


def test_control_gang_without_topology_spans_racks(env: GangEnv) -> None:
    env.add_node("rack-a")
    env.add_node("rack-b")
    env.podgroup("pg", min_count=2)
    with GangWatch(
        env.api, env.namespace, env.selector, node_label=RACK_LABEL, settle=SETTLE
    ) as watcher:
        env.pod("pg-0", "pg")
        env.pod("pg-1", "pg")
        watcher.wait(bound("pg", 2), "both members bound", 60)
    assert watcher.spans(), watcher.report()
    assert not watcher.partly_bound(), watcher.report()
    assert watcher.latest()["pg"].domains == {"rack-a", "rack-b"}

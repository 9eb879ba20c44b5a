"""The cluster tier's own foundation: a real control plane with fake GPU nodes behaves like one.

Images are never pulled (KWOK runs no containers); `registry.invalid` makes that explicit.
"""

from __future__ import annotations

import ipaddress
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from cluster.kubehelpers import Cluster, install_crd, pod_ready, wait_for
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.utils import parse_quantity
from localcluster import GPU_RESOURCE, K8S_VERSION, RDMA_RESOURCE, LocalCluster
from localcluster import NODE_SELECTOR_ANNOTATION as FAKE_NODE
from operator_harness import READY_DELAY, TERMINATE_MESSAGE

IMAGE = "registry.invalid/pdmtp/fake:0"


def pod_body(
    name: str,
    gpus: int = 0,
    annotations: dict[str, str] | None = None,
    restart_policy: str = "Always",
) -> dict[str, Any]:
    limits = {GPU_RESOURCE: str(gpus)} if gpus else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "restartPolicy": restart_policy,
            # Nothing runs, so nothing to wait for; it also keeps namespace deletion at the
            # controller's fixed 5s instead of an estimate derived from the grace period.
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "engine", "image": IMAGE, "resources": {"limits": limits}}],
        },
    }


def require_pdmtp_stages(core: client.CoreV1Api) -> None:
    # The annotations are implemented by hack/kwok stages: present on the local cluster, and on
    # kind only when KWOK was installed with them (fake nodes then carry the KWOK annotation).
    nodes = core.list_node(limit=50).items
    if not any((n.metadata.annotations or {}).get(FAKE_NODE[0]) == FAKE_NODE[1] for n in nodes):
        pytest.skip("no KWOK-managed fake nodes: hack/kwok stages are not installed")


def assert_fake_private_ip(ip: str | None) -> None:
    # Pod IPs are fake: private, never loopback (Endpoints validation would reject it) and
    # never dialled by anything here.
    assert ip, "pod has no IP"
    addr = ipaddress.ip_address(ip)
    assert addr.is_private and not addr.is_loopback, ip


def test_apiserver_reports_pinned_version(cluster: Cluster) -> None:
    info = client.VersionApi(cluster.api_client).get_code()
    if cluster.local is None:
        pytest.skip(f"{cluster.backend} cluster runs {info.git_version}; the pin is for local")
    assert info.git_version == K8S_VERSION
    assert info.major == "1" and K8S_VERSION.startswith(f"v1.{info.minor}.")


def test_fake_gpu_nodes_advertise_gpus_and_rdma(core: client.CoreV1Api) -> None:
    nodes = [n for n in core.list_node().items if GPU_RESOURCE in (n.status.allocatable or {})]
    assert len(nodes) >= 1
    for node in nodes:
        alloc = node.status.allocatable
        assert parse_quantity(alloc[GPU_RESOURCE]) == 8
        # Quantities come back canonical: 1000 reads "1k".
        assert parse_quantity(alloc.get(RDMA_RESOURCE, "0")) == 1000
        ready = {c.type: c.status for c in node.status.conditions}
        assert ready.get("Ready") == "True", node.metadata.name


def test_gpu_pod_is_scheduled_and_becomes_ready(core: client.CoreV1Api, namespace: str) -> None:
    core.create_namespaced_pod(namespace, pod_body("gpu8", gpus=8))
    core.create_namespaced_pod(namespace, pod_body("gpu9", gpus=9))

    pod = wait_for(
        lambda: (p := core.read_namespaced_pod("gpu8", namespace)) and pod_ready(p) and p,
        "8-GPU pod Ready",
    )
    node = core.read_node(pod.spec.node_name)
    assert parse_quantity(node.status.allocatable[GPU_RESOURCE]) == 8
    assert pod.status.phase == "Running"
    assert_fake_private_ip(pod.status.pod_ip)

    # No node has 9 GPUs: the real scheduler must say so rather than place it.
    def unschedulable() -> bool:
        conds = core.read_namespaced_pod("gpu9", namespace).status.conditions or []
        return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conds)

    wait_for(unschedulable, "9-GPU pod reported Unschedulable")


def test_deployment_pods_are_created_and_ready(cluster: Cluster, namespace: str) -> None:
    apps = client.AppsV1Api(cluster.api_client)
    labels = {"app": "web"}
    apps.create_namespaced_deployment(
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "web", "image": IMAGE}]},
                },
            },
        },
    )
    wait_for(
        lambda: (
            (apps.read_namespaced_deployment_status("web", namespace).status.ready_replicas or 0)
            == 3
        ),
        "3 ready replicas",
    )
    pods = client.CoreV1Api(cluster.api_client).list_namespaced_pod(namespace).items
    assert len(pods) == 3
    for pod in pods:
        assert pod.metadata.owner_references[0].kind == "ReplicaSet"
        assert_fake_private_ip(pod.status.pod_ip)


def test_a_fresh_clusters_first_pods_get_addresses_of_their_own(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Pods Ready at one moment on a fresh KWOK each get an IP no other live pod has, as in any
    real cluster (`localcluster.ip_pool_primer`: the operator matches router args to pods by
    address)."""
    if cluster.local is None:
        pytest.skip(f"the {cluster.backend} cluster is not started by this tier")
    local = LocalCluster(tmp_path / "fresh", nodes=4, die_with_parent=True, gang_scheduling=False)
    local.start()
    api = config.new_client_from_config(config_file=str(local.kubeconfig))
    try:
        core = client.CoreV1Api(api)
        nodes = local.node_names()
        bodies = []
        for i in range(16):
            # Bound, not scheduled, with one delay: their Ready timers expire together.
            body = pod_body(f"p{i}", annotations={READY_DELAY: "800"})
            body["spec"]["nodeName"] = nodes[i % len(nodes)]
            bodies.append(body)
        with ThreadPoolExecutor(len(bodies)) as pool:
            list(pool.map(lambda b: core.create_namespaced_pod("default", b), bodies))

        def addresses() -> list[str] | None:
            ips = [p.status.pod_ip for p in core.list_namespaced_pod("default").items]
            return ips if len(ips) == len(bodies) and all(ips) else None

        ips = wait_for(addresses, "every pod's IP")
        assert len(set(ips)) == len(ips), sorted(ips)
    finally:
        api.close()
        local.stop()


def test_garbage_collector_and_namespace_deletion(core: client.CoreV1Api) -> None:
    ns = f"t-gc-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    wait_for(lambda: core.read_namespaced_service_account("default", ns), "default SA")
    owner = core.create_namespaced_config_map(ns, {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    core.create_namespaced_config_map(
        ns, {"metadata": {"name": "dependent", "ownerReferences": [ref]}}
    )
    core.create_namespaced_pod(ns, pod_body("worker"))
    wait_for(lambda: pod_ready(core.read_namespaced_pod("worker", ns)), "worker Ready")

    core.delete_namespaced_config_map("owner", ns, propagation_policy="Background")

    def gone(read: Any, *args: str) -> bool:
        try:
            read(*args)
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    wait_for(lambda: gone(core.read_namespaced_config_map, "dependent", ns), "dependent GC'd")

    # Namespace deletion needs the namespace controller and the pod's (fake) kubelet to finish.
    core.delete_namespace(ns)
    wait_for(lambda: gone(core.read_namespace, ns), f"namespace {ns} deleted", timeout=60)


def widget_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.test.pdmtp.io"},
        "spec": {
            "group": "test.pdmtp.io",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {
                                        "replicas": {"type": "integer"},
                                        "minReplicas": {"type": "integer"},
                                    },
                                    "x-kubernetes-validations": [
                                        {
                                            "rule": "self.minReplicas <= self.replicas",
                                            "message": "minReplicas must not exceed replicas",
                                        }
                                    ],
                                }
                            },
                        }
                    },
                }
            ],
        },
    }


def test_crd_cel_rule_rejects_bad_object(cluster: Cluster, namespace: str, tmp_path: Any) -> None:
    import yaml

    path = tmp_path / "widget-crd.yaml"
    path.write_text(yaml.safe_dump(widget_crd()))
    install_crd(cluster.api_client, path)
    custom = client.CustomObjectsApi(cluster.api_client)

    def widget(name: str, replicas: int, minimum: int) -> dict[str, Any]:
        return {
            "apiVersion": "test.pdmtp.io/v1",
            "kind": "Widget",
            "metadata": {"name": name},
            "spec": {"replicas": replicas, "minReplicas": minimum},
        }

    try:
        custom.create_namespaced_custom_object(
            "test.pdmtp.io", "v1", namespace, "widgets", widget("good", 3, 1)
        )
        with pytest.raises(ApiException) as err:
            custom.create_namespaced_custom_object(
                "test.pdmtp.io", "v1", namespace, "widgets", widget("bad", 1, 3)
            )
        assert err.value.status == 422
        assert "minReplicas must not exceed replicas" in err.value.body
    finally:
        client.ApiextensionsV1Api(cluster.api_client).delete_custom_resource_definition(
            "widgets.test.pdmtp.io"
        )


def _seconds_until_ready(
    core: client.CoreV1Api, namespace: str, names: list[str]
) -> dict[str, float]:
    start = time.monotonic()
    took: dict[str, float] = {}
    deadline = start + 30
    while len(took) < len(names) and time.monotonic() < deadline:
        for name in names:
            if name not in took and pod_ready(core.read_namespaced_pod(name, namespace)):
                took[name] = time.monotonic() - start
        time.sleep(0.05)
    assert len(took) == len(names), f"not Ready in 30s: {set(names) - set(took)}"
    return took


def test_fake_ready_delay_annotation(core: client.CoreV1Api, namespace: str) -> None:
    require_pdmtp_stages(core)
    core.create_namespaced_pod(namespace, pod_body("quick"))
    core.create_namespaced_pod(namespace, pod_body("slow", annotations={READY_DELAY: "4000"}))
    took = _seconds_until_ready(core, namespace, ["quick", "slow"])
    # Absolute times include scheduling and watch latency, so compare against the default pod.
    assert took["slow"] >= 3.5, took
    assert took["slow"] - took["quick"] >= 2.0, took


def test_fake_terminate_message_annotation(core: client.CoreV1Api, namespace: str) -> None:
    require_pdmtp_stages(core)
    message = 'engine refused config: "kv_role" must be one of kv_producer, kv_consumer'
    for name, policy in (("once", "Never"), ("always", "Always")):
        core.create_namespaced_pod(
            namespace,
            pod_body(name, annotations={TERMINATE_MESSAGE: message}, restart_policy=policy),
        )

    def terminated(name: str) -> client.V1Pod | None:
        pod = core.read_namespaced_pod(name, namespace)
        statuses = pod.status.container_statuses or []
        return pod if statuses and statuses[0].state.terminated else None

    for name, phase in (("once", "Failed"), ("always", "Running")):
        pod = wait_for(lambda n=name: terminated(n), f"{name} terminated")
        state = pod.status.container_statuses[0].state.terminated
        assert (state.exit_code, state.reason, state.message) == (1, "Error", message)
        assert not pod_ready(pod)
        assert pod.status.container_statuses[0].ready is False
        assert pod.status.phase == phase

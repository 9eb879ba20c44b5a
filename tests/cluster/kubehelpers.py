"""Helpers for cluster-tier tests: waiting, and installing CRDs until they are really served."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from pdmtp.core import objects

if TYPE_CHECKING:
    from localcluster import LocalCluster

T = TypeVar("T")


@dataclass
class Cluster:
    """What the session's `cluster` fixture yields."""

    kubeconfig: Path
    api_client: client.ApiClient
    backend: str  # local | existing | kind
    local: LocalCluster | None = None  # the launcher, when this session started the cluster


def wait_for(
    probe: Callable[[], T | None],
    what: str,
    timeout: float = 30,
    interval: float = 0.1,
    transient: tuple[type[Exception], ...] = (ApiException,),
) -> T:
    """Poll ``probe`` until it returns something truthy; return that value. ``transient``
    errors (by default the API's: object not there yet, CRD not served yet) mean "not yet"."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = probe()
            if value:
                return value
        except transient as exc:
            last_error = exc
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(interval)


def kubectl(
    cluster: Cluster, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The cluster's own kubectl (the local control plane's build, else PATH's), unchecked."""
    binary = cluster.local.bin_dir / "kubectl" if cluster.local else Path("kubectl")
    return subprocess.run(
        [str(binary), "--kubeconfig", str(cluster.kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def kubeconfig_server(kubeconfig: Path) -> str:
    """The API server URL of the kubeconfig's current context ("" when it names none)."""
    doc = yaml.safe_load(kubeconfig.read_text()) or {}
    current = doc.get("current-context")
    ctx = next((c["context"] for c in doc.get("contexts") or [] if c["name"] == current), {})
    clusters = doc.get("clusters") or []
    cluster = next((c["cluster"] for c in clusters if c["name"] == ctx.get("cluster")), {})
    server: str = cluster.get("server", "")
    return server


def install_crd(
    api_client: client.ApiClient, path: Path | str | dict[str, Any], timeout: float = 30
) -> dict[str, Any]:
    """Create (or replace) a CRD and wait until it is Established and a list call succeeds.

    Established alone is not enough: discovery and the handler for the new resource can lag a
    moment behind, and a create issued in that window fails with 404.
    """
    crd: dict[str, Any] = (
        path if isinstance(path, dict) else yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    )
    ext = client.ApiextensionsV1Api(api_client)
    name = crd["metadata"]["name"]
    try:
        ext.create_custom_resource_definition(crd)
    except ApiException as exc:
        if exc.status != 409:
            raise
        current = ext.read_custom_resource_definition(name)
        crd["metadata"]["resourceVersion"] = current.metadata.resource_version
        ext.replace_custom_resource_definition(name, crd)

    def established() -> bool:
        conds = ext.read_custom_resource_definition(name).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conds)

    wait_for(established, f"CRD {name} Established", timeout)

    group = crd["spec"]["group"]
    plural = crd["spec"]["names"]["plural"]
    custom = client.CustomObjectsApi(api_client)
    for version in (v["name"] for v in crd["spec"]["versions"] if v.get("served", True)):

        def served(version: str = version) -> bool:
            custom.list_cluster_custom_object(group, version, plural, limit=1)
            return True

        wait_for(served, f"{plural}.{group}/{version} served", timeout)
    return crd


def pod_ready(pod: client.V1Pod) -> bool:
    """The operator's own readiness rule (`pdmtp.core.objects.pod_ready`) on a typed pod."""
    return objects.pod_ready(client.ApiClient().sanitize_for_serialization(pod))


def evict(cluster: Cluster, namespace: str, pod: str) -> int:
    """POST pods/<pod>/eviction (policy/v1), as `kubectl drain` does: 201 when the pod was
    evicted, 429 when a disruption budget refused it (any other answer fails the test)."""
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=namespace))
    try:
        client.CoreV1Api(cluster.api_client).create_namespaced_pod_eviction(pod, namespace, body)
    except ApiException as e:
        assert e.status == 429 and "disruption budget" in str(e.body), e.body
        return 429
    return 201


def budget_counted(
    cluster: Cluster, namespace: str, name: str, allowed: int, pods: int, timeout: float = 30
) -> client.V1PodDisruptionBudget:
    """PodDisruptionBudget `name` once the disruption controller has counted its current spec
    with `pods` expected, all of them healthy, and `allowed` disruptions."""
    policy = client.PolicyV1Api(cluster.api_client)

    def counted() -> client.V1PodDisruptionBudget | None:
        b = policy.read_namespaced_pod_disruption_budget(name, namespace)
        s = b.status
        if s is None or s.observed_generation != b.metadata.generation:
            return None
        seen = (s.expected_pods, s.current_healthy, s.disruptions_allowed)
        return b if seen == (pods, pods, allowed) else None

    return wait_for(counted, f"{name}: {allowed} of {pods} pods allowed", timeout, 0.2)

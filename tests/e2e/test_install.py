"""The operator as users install it: `kubectl apply -k deploy/` (through an overlay that only
swaps in the locally built image), running in-cluster under its own ServiceAccount and RBAC."""

from __future__ import annotations

import json
import re

from e2e.kindkit import OPERATOR_NAMESPACE, Kind

SA = f"system:serviceaccount:{OPERATOR_NAMESPACE}:pdmtp-operator"


def test_operator_runs_in_cluster_from_deploy_with_its_own_identity(kind: Kind) -> None:
    kind.kubectl(
        "-n",
        OPERATOR_NAMESPACE,
        "wait",
        "--for=condition=Available",
        "deploy/pdmtp-operator",
        "--timeout=120s",
        timeout=150,
    )
    pods = kind.pods(OPERATOR_NAMESPACE, "app.kubernetes.io/name=pdmtp-operator")
    # Two replicas (deploy/operator/operator.yaml): one leads on the Lease, one stands by.
    assert len(pods) == 2, [p["metadata"]["name"] for p in pods]
    for pod in pods:
        assert pod["spec"]["serviceAccountName"] == "pdmtp-operator"
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        (container,) = pod["status"]["containerStatuses"]
        assert container["image"].endswith(kind.images.operator.split("/")[-1])
        assert container["ready"] and container["restartCount"] == 0, container
        # A real node, not a fake one: the kubelet reports the container's start.
        assert "running" in container["state"], container["state"]
    leader = kind.operator_leader()
    assert leader in {p["metadata"]["name"] for p in pods}
    # Each says who it is and who leads (/readyz), the standby as ready as the leader.
    for pod in pods:
        name = pod["metadata"]["name"]
        ready = json.loads(
            kind.raw(f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/pods/{name}:8081/proxy/readyz")
        )
        assert ready["ready"] is True, ready
        assert ready["leader"]["leading"] is (name == leader), ready
        assert ready["leader"]["holder"].rsplit("_", 1)[0] == leader, ready


def test_operator_rbac_is_least_privilege(kind: Kind) -> None:
    def can(verb: str, resource: str, *, namespace: str = "default") -> bool:
        resource, _, sub = resource.partition("/")
        subresource = [f"--subresource={sub}"] if sub else []
        out = kind.kubectl(
            "auth",
            "can-i",
            verb,
            resource,
            *subresource,
            f"--as={SA}",
            "-n",
            namespace,
            check=False,
        )
        return out.strip() == "yes"

    allowed = [
        ("watch", "pddeployments.pdmtp.io"),
        ("patch", "pddeployments.pdmtp.io/status"),
        ("create", "deployments.apps"),
        ("delete", "deployments.apps"),
        ("list", "pods"),
        ("patch", "pods"),  # annotations only: a pod leaving routing before a scale-down
        ("create", "pods"),  # a multi-node group's pods, created and deleted whole
        ("delete", "pods"),
        ("create", "podgroups.scheduling.k8s.io"),
        ("create", "services"),
        ("create", "networkpolicies.networking.k8s.io"),
        ("create", "events"),
    ]
    denied = [
        ("get", "secrets"),
        ("list", "configmaps"),
        ("update", "pods"),
        ("create", "pods/exec"),
        ("delete", "serviceaccounts"),
        ("patch", "pddeployments.pdmtp.io"),  # spec belongs to the user; status only
        ("create", "clusterroles.rbac.authorization.k8s.io"),
        ("patch", "nodes"),
    ]
    assert [(v, r) for v, r in allowed if not can(v, r)] == []
    assert [(v, r) for v, r in denied if can(v, r)] == []


def test_metrics_service_is_scraped_and_liveness_answers(kind: Kind) -> None:
    # Through the API server's service proxy: the same Service a Prometheus would scrape.
    metrics = kind.raw(
        f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/services/pdmtp-operator-metrics:metrics/proxy/metrics"
    )
    for family in ("pdmtp_reconcile_total", "pdmtp_api_requests_total", "pdmtp_leader"):
        assert f"# TYPE {family}" in metrics, f"{family} not exported:\n{metrics[:2000]}"
    name = kind.operator_leader()
    assert re.search(
        r'^pdmtp_leader\{identity="' + re.escape(name) + r'_\w+"\} 1\.0$',
        kind.operator_metrics(),
        re.M,
    ), "the leader's pdmtp_leader is not 1"
    health = kind.raw(f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/pods/{name}:8081/proxy/healthz")
    assert health.strip().startswith("{"), health

"""The operator as users install it: `kubectl apply -k deploy/`, then the operator running under
its own ServiceAccount token (not an admin certificate), its metrics scraped on 127.0.0.1."""

from __future__ import annotations

import base64
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pdmtp
import pytest
import yaml
from builders import compat_revision, pdd
from cluster.kubehelpers import Cluster, kubectl, wait_for
from kubernetes import client, config
from operator_harness import OperatorProcess, create_pdd, get_pdd, patch_spec, settled

REPO = Path(__file__).resolve().parents[2]
SYSTEM_NS, ACCOUNT = "pdmtp-system", "pdmtp-operator"
CRD, GUARD = "pddeployments.pdmtp.io", "pdmtp-crd-deletion-guard"


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> Iterator[None]:
    done = kubectl(cluster, "apply", "--server-side", "-k", str(REPO / "deploy"))
    assert done.returncode == 0, done.stderr
    # The README's next step: wait until the API server serves the new kinds.
    binary = cluster.local.bin_dir / "kubectl" if cluster.local else Path("kubectl")
    served = subprocess.run(
        ["hack/wait-crds.sh", CRD, "pdrolescales.pdmtp.io"],
        cwd=REPO,
        env={**os.environ, "KUBECTL": str(binary), "KUBECONFIG": str(cluster.kubeconfig)},
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert served.returncode == 0, served.stdout + served.stderr
    assert f"customresourcedefinition/{CRD} served" in served.stdout, served.stdout
    dry = kubectl(cluster, "apply", "--server-side", "-k", str(REPO / "deploy"), "--dry-run=server")
    assert dry.returncode == 0, dry.stderr
    yield
    # Later files of the session delete and recreate the CRD (recovery from a late CRD): the
    # guard goes, and the API server must have stopped enforcing it (it does so a moment later).
    for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
        kubectl(cluster, "delete", kind, GUARD, "--ignore-not-found")
    wait_for(
        lambda: delete_crd_dry_run(cluster).returncode == 0, "the CRD guard withdrawn", 30, 0.5
    )


def delete_crd_dry_run(cluster: Cluster) -> subprocess.CompletedProcess[str]:
    """What `kubectl delete crd` would do, asked of the API server without deleting anything:
    admission (the guard) runs for a dry run as for the real request."""
    return kubectl(cluster, "delete", "crd", CRD, "--dry-run=server")


def test_deleting_the_crd_is_refused_until_annotated(cluster: Cluster, installed: None) -> None:
    # The policy is enforced once the API server has loaded it (a few seconds after creation).
    refused = wait_for(
        lambda: (d := delete_crd_dry_run(cluster)).returncode != 0 and d,
        "the CRD deletion guard in force",
        30,
        0.5,
    )
    assert "pdmtp-crd-deletion-guard" in refused.stderr, refused.stderr
    assert "pdmtp.io/allow-delete=true" in refused.stderr, refused.stderr
    # Uninstalling the operator part alone goes through: it is not a CRD.
    dry = kubectl(cluster, "delete", "-k", str(REPO / "deploy" / "operator"), "--dry-run=server")
    assert dry.returncode == 0, dry.stderr
    assert CRD not in dry.stdout
    annotate = ["annotate", "crd", CRD]
    assert kubectl(cluster, *annotate, "pdmtp.io/allow-delete=true").returncode == 0
    try:
        allowed = delete_crd_dry_run(cluster)
        assert allowed.returncode == 0, allowed.stderr
    finally:
        assert kubectl(cluster, *annotate, "pdmtp.io/allow-delete-").returncode == 0
    assert delete_crd_dry_run(cluster).returncode != 0


@pytest.fixture(scope="module")
def operator_kubeconfig(
    cluster: Cluster, installed: None, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A kubeconfig that authenticates as the shipped ServiceAccount, with a fresh token."""
    core = client.CoreV1Api(cluster.api_client)
    token = core.create_namespaced_service_account_token(
        ACCOUNT, SYSTEM_NS, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])
    server = next(c for c in admin["clusters"] if c["name"] == context["context"]["cluster"])
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": server["cluster"]}],
        "users": [{"name": ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": ACCOUNT}}],
        "current-context": "sa",
    }
    path = tmp_path_factory.mktemp("sa") / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def can(
    api: client.ApiClient, verb: str, resource: str, namespace: str = "default", group: str = ""
) -> bool:
    review = client.AuthorizationV1Api(api).create_self_subject_access_review(
        {
            "spec": {
                "resourceAttributes": {
                    "verb": verb,
                    "resource": resource,
                    "group": group,
                    "namespace": namespace,
                }
            }
        }
    )
    return bool(review.status.allowed)


def test_service_account_cannot_read_secrets_or_touch_unrelated_things(
    operator_kubeconfig: Path, namespace: str
) -> None:
    api = config.new_client_from_config(config_file=str(operator_kubeconfig))
    try:
        who = client.AuthenticationV1Api(api).create_self_subject_review({}).status.user_info
        assert who.username == f"system:serviceaccount:{SYSTEM_NS}:{ACCOUNT}"
        assert can(api, "patch", "deployments", namespace, "apps")
        assert can(api, "list", "pods", namespace)
        assert can(api, "watch", "networkpolicies", namespace, "networking.k8s.io")
        assert can(api, "patch", "pddeployments/status", namespace, "pdmtp.io")
        # A multi-node group's pods and PodGroup are the operator's own (created, deleted whole).
        assert can(api, "create", "pods", namespace)
        assert can(api, "delete", "pods", namespace)
        assert can(api, "create", "podgroups", namespace, "scheduling.k8s.io")
        # Leader election's Lease: in the operator's own namespace only.
        for verb in ("get", "create", "update"):
            assert can(api, verb, "leases", SYSTEM_NS, "coordination.k8s.io")
            assert not can(api, verb, "leases", namespace, "coordination.k8s.io")
        for verb, resource, group in [
            ("get", "secrets", ""),
            ("list", "secrets", ""),
            ("watch", "secrets", ""),
            ("create", "configmaps", ""),
            ("update", "pods", ""),
            ("create", "pods/exec", ""),
            ("update", "pddeployments", "pdmtp.io"),
            ("delete", "pddeployments", "pdmtp.io"),
            ("delete", "serviceaccounts", ""),
            ("create", "roles", "rbac.authorization.k8s.io"),
            ("create", "clusterrolebindings", "rbac.authorization.k8s.io"),
            ("delete", "namespaces", ""),
            ("update", "nodes", ""),
        ]:
            assert not can(api, verb, resource, namespace, group), f"may {verb} {resource}"
        with pytest.raises(client.ApiException) as denied:
            client.CoreV1Api(api).list_namespaced_secret(namespace)
        assert denied.value.status == 403
    finally:
        api.close()


@pytest.fixture
def sa_operator(
    cluster: Cluster, operator_kubeconfig: Path, namespace: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    # Electing as deploy/ runs it: the Lease in the operator's own namespace, under its Role.
    election = [
        "--leader-elect",
        f"--leader-election-namespace={SYSTEM_NS}",
        f"--leader-election-id=pdmtp-operator-{namespace}"[:63],
    ]
    op = OperatorProcess(
        operator_kubeconfig, [namespace], tmp_path / "operator.log", extra_args=election
    )
    op.start()
    yield op
    op.stop()
    print("---- operator log ----\n" + op.log_tail(150))


def metric(m: dict[str, float], metric_name: str, **labels: str) -> float:
    want = [f'{k}="{val}"' for k, val in labels.items()]
    return sum(
        val
        for key, val in m.items()
        if key.split("{")[0] == metric_name and all(w in key for w in want)
    )


def test_operator_under_its_own_identity_rolls_and_serves_metrics(
    cluster: Cluster, namespace: str, sa_operator: OperatorProcess
) -> None:
    api = cluster.api_client
    b = pdd("sa").mtp(3, modules=3).prefill(replicas=2).rollout(drainSeconds=2)
    create_pdd(api, namespace, b.dict())
    wait_for(lambda: settled(get_pdd(api, namespace, "sa")), "Available", 90, 0.5)

    b.mtp(2, modules=3)
    patch_spec(api, namespace, "sa", b.dict()["spec"])
    seen: list[float] = []

    def progressed() -> Any:
        m = sa_operator.metrics()
        seen.append(metric(m, "pdmtp_rollout_progress_ratio", name="sa"))
        obj = get_pdd(api, namespace, "sa")
        return settled(obj) and obj["status"]["currentRevision"] == compat_revision(b.build().spec)

    wait_for(progressed, "paired roll under the ServiceAccount", 120, 0.3)

    # Metrics follow the status write by a moment (events are posted in between).
    def final_metrics() -> dict[str, float] | None:
        m = sa_operator.metrics()
        done = metric(m, "pdmtp_rollout_progress_ratio", name="sa") == 1.0
        return m if done and metric(m, "pdmtp_revisions", name="sa") == 1 else None

    m = wait_for(final_metrics, "metrics of the finished roll", 10, 0.2)
    # The build: its version on the log's first line and in a metric.
    # (after the harness's own "===== start #1 =====" marker)
    first = sa_operator.log_path.read_text().split("=====\n", 1)[1].splitlines()[0]
    assert f"pdmtp {pdmtp.__version__} starting" in first, first
    assert metric(m, "pdmtp_build_info", version=pdmtp.__version__) == 1
    leader = [v for k, v in m.items() if k.startswith("pdmtp_leader{")]
    assert leader == [1.0], "it leads, on the Lease its Role grants"
    assert metric(m, "pdmtp_reconcile_total", namespace=namespace, name="sa") > 3
    assert metric(m, "pdmtp_reconcile_duration_seconds_count") > 3
    assert metric(m, "pdmtp_child_writes_total", name="sa", action="scale") >= 1
    assert min(seen) < 1.0, "progress was seen partial during the roll"

    b.prefill(k=3).mtp(2)  # incompatible: mtpModules undeclared, k differs
    spec = b.dict()["spec"]
    spec["model"]["mtpModules"] = None  # a merge patch removes a field with null
    patch_spec(api, namespace, "sa", spec)
    wait_for(
        lambda: (
            metric(
                sa_operator.metrics(),
                "pdmtp_validation_failures_total",
                name="sa",
                reason="MTPModulesUnknown",
            )
            >= 1
        ),
        "validation metric",
        30,
    )
    assert metric(sa_operator.metrics(), "pdmtp_config_compatible", name="sa") == 0
    time.sleep(0.5)
    assert "Forbidden" not in sa_operator.log_tail(400), sa_operator.log_tail(40)


def test_tokens_are_not_admin(operator_kubeconfig: Path) -> None:
    doc = yaml.safe_load(operator_kubeconfig.read_text())
    user = doc["users"][0]["user"]
    assert set(user) == {"token"}
    header = user["token"].split(".")[0]
    assert base64.urlsafe_b64decode(header + "==")  # a JWT, not a certificate

"""The Helm chart (charts/pdmtp) against a real API server: install (taking over the CRDs an
earlier install left, as a move from `kubectl apply -k deploy/` does), upgrade with changed
values, uninstall leaving the CRDs, their guard and a PDDeployment in place (crds.keep), and
the purge (crds.keep=false, then uninstall) removing the CRDs and the PDDeployment with them.

The operator's pod is a KWOK fake here: the test asserts objects, not a running process. The
session's CRDs are back (installed as the `crd` fixture installs them) and the deletion guard is
gone when it ends, whatever happened: later files delete and recreate the CRD.

helm comes from `make helm-bin` (`make test-cluster` builds it; PDMTP_HELM names it). Without it
this test is skipped with a warning; PDMTP_REQUIRE_ALL=1 (as make runs it) fails instead.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pdmtp
import pytest
from builders import pdd
from chart import ALLOW_DELETE, CHART, KEEP, HelmError, helm_binary, run_helm
from cluster.kubehelpers import Cluster, install_crd, kubectl, wait_for
from kubernetes import client
from kubernetes.client.rest import ApiException
from operator_harness import create_pdd, get_pdd

REPO = Path(__file__).resolve().parents[2]
RELEASE = "pdmtp"
CRDS = ("pddeployments.pdmtp.io", "pdrolescales.pdmtp.io")
GUARD = "pdmtp-crd-deletion-guard"
REGISTRY = "registry.example.com/pdmtp-operator"  # the README's $REG/pdmtp-operator


class Helm:
    """helm against the session's API server, with its own config, cache and data dirs."""

    def __init__(self, binary: Path, cluster: Cluster, home: Path, namespace: str) -> None:
        self.binary, self.cluster, self.namespace = binary, cluster, namespace
        self.env = {f"HELM_{d}_HOME": str(home / d.lower()) for d in ("CACHE", "CONFIG", "DATA")}

    def __call__(self, *args: str) -> str:
        started = time.monotonic()
        out = run_helm(
            self.binary,
            *args,
            "--kubeconfig",
            str(self.cluster.kubeconfig),
            "-n",
            self.namespace,
            env=self.env,
        )
        print(f"helm {args[0]}: {time.monotonic() - started:.1f}s")
        return out


@pytest.fixture
def helm(cluster: Cluster, crd: None, namespace: str, tmp_path: Path) -> Iterator[Helm]:
    binary = helm_binary()
    if binary is None or not os.access(binary, os.X_OK):
        why = f"no helm binary (PDMTP_HELM={os.environ.get('PDMTP_HELM')!r}); run `make helm-bin`"
        if os.environ.get("PDMTP_REQUIRE_ALL") == "1":
            pytest.fail(f"helm required (PDMTP_REQUIRE_ALL=1, as make runs it): {why}")
        warnings.warn(pytest.PytestWarning(f"the Helm chart NOT TESTED: {why}"), stacklevel=2)
        pytest.skip(f"the Helm chart not tested: {why}")
    h = Helm(binary, cluster, tmp_path / "helm", namespace)
    try:
        yield h
    finally:
        restore_session_crds(h)


def restore_session_crds(h: Helm) -> None:
    """What the rest of the session expects: no release, no guard, the CRDs as `crd` installs
    them (no Helm metadata: a replace drops it), and a CRD delete admitted again."""
    try:
        h("uninstall", RELEASE, "--wait")
    except HelmError as exc:
        if "not found" not in str(exc):
            print(f"cleanup: {exc}")
    api = h.cluster.api_client
    admission = client.AdmissionregistrationV1Api(api)
    for delete in (
        admission.delete_validating_admission_policy_binding,
        admission.delete_validating_admission_policy,
    ):
        try:
            delete(GUARD)
        except ApiException as exc:
            if exc.status != 404:
                raise
    for name in CRDS:
        install_crd(api, REPO / "crds" / f"pdmtp.io_{name.split('.')[0]}.yaml")
    wait_for(
        lambda: kubectl(h.cluster, "delete", "crd", CRDS[0], "--dry-run=server").returncode == 0,
        "a CRD delete admitted once the guard is gone",
        30,
        0.5,
    )


def read(call: Any, *args: str) -> Any | None:
    """The object, or None when it does not exist."""
    try:
        return call(*args)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def crd_metadata(api: client.ApiClient, name: str) -> client.V1ObjectMeta | None:
    crd = read(client.ApiextensionsV1Api(api).read_custom_resource_definition, name)
    return None if crd is None else crd.metadata


def guard_present(api: client.ApiClient) -> bool:
    admission = client.AdmissionregistrationV1Api(api)
    policy = read(admission.read_validating_admission_policy, GUARD)
    binding = read(admission.read_validating_admission_policy_binding, GUARD)
    return policy is not None and binding is not None


def test_install_upgrade_uninstall_keeps_the_crds_and_purge_removes_them(
    cluster: Cluster, helm: Helm, namespace: str
) -> None:
    api = cluster.api_client
    apps = client.AppsV1Api(api)
    core = client.CoreV1Api(api)
    rbac = client.RbacAuthorizationV1Api(api)
    chart = str(CHART)

    # 1. Install over the CRDs the session already has (not Helm's: taken over, as when moving
    #    from `kubectl apply -k deploy/`). After test_install.py's server-side kubectl install,
    #    kubectl's field manager still co-owns the cluster-scoped objects' fields, so a value Helm
    #    changes (the ClusterRoleBinding's subject here, the rules below) needs --force-conflicts,
    #    as it does after a real move from kustomize (README).
    helm(
        "install", RELEASE, chart, "--set", "image.tag=dev", "--take-ownership", "--force-conflicts"
    )
    operator = apps.read_namespaced_deployment("pdmtp-operator", namespace)
    assert operator.spec.selector.match_labels == {"app.kubernetes.io/name": "pdmtp-operator"}
    assert operator.metadata.labels["app.kubernetes.io/managed-by"] == "Helm"
    container = operator.spec.template.spec.containers[0]
    assert container.image == "pdmtp-operator:dev"
    assert container.args[0] == "--all-namespaces"
    assert operator.spec.template.spec.service_account_name == "pdmtp-operator"
    core.read_namespaced_service_account("pdmtp-operator", namespace)
    core.read_namespaced_service("pdmtp-operator-metrics", namespace)
    binding = rbac.read_cluster_role_binding("pdmtp-operator")
    assert binding.subjects[0].namespace == namespace
    for name in CRDS:
        meta = crd_metadata(api, name)
        assert meta is not None
        assert (meta.annotations or {}).get(KEEP) == "keep"
        assert (meta.annotations or {}).get("meta.helm.sh/release-name") == RELEASE
        assert meta.labels["app.kubernetes.io/part-of"] == "pdmtp"
    assert guard_present(api)
    pdd_body = pdd("kept").dict()
    create_pdd(api, namespace, pdd_body)

    # 2. Upgrade with changed values: debug logging, this namespace only (RoleBinding here).
    helm(
        "upgrade",
        RELEASE,
        chart,
        "--reuse-values",
        "--force-conflicts",
        "--set",
        "logLevel=debug",
        "--set",
        f"watchNamespaces={{{namespace}}}",
    )
    args = apps.read_namespaced_deployment("pdmtp-operator", namespace).spec.template.spec
    assert args.containers[0].args[0] == f"--namespace={namespace}"
    assert args.containers[0].args[-1] == "-v"
    assert args.containers[0].image == "pdmtp-operator:dev"  # --reuse-values kept the tag
    role_binding = rbac.read_namespaced_role_binding("pdmtp-operator", namespace)
    assert role_binding.role_ref.name == "pdmtp-operator"
    rbac.read_cluster_role_binding("pdmtp-operator-cluster")
    assert read(rbac.read_cluster_role_binding, "pdmtp-operator") is None
    status = json.loads(helm("status", RELEASE, "-o", "json"))
    assert (status["version"], status["info"]["status"]) == (2, "deployed")
    # The README's upgrade, `--reuse-values` alone: the values set so far stay.
    helm("upgrade", RELEASE, chart, "--reuse-values")
    again = apps.read_namespaced_deployment("pdmtp-operator", namespace).spec.template.spec
    assert again.containers[0].args == args.containers[0].args
    assert again.containers[0].image == "pdmtp-operator:dev"
    status = json.loads(helm("status", RELEASE, "-o", "json"))
    assert (status["version"], status["info"]["status"]) == (3, "deployed")

    # 3. The guard is in force (admission dry run: nothing is deleted).
    refused = wait_for(
        lambda: (
            (d := kubectl(cluster, "delete", "crd", CRDS[0], "--dry-run=server")).returncode != 0
            and d
        ),
        "the CRD deletion guard in force",
        30,
        0.5,
    )
    assert GUARD in refused.stderr, refused.stderr

    # 4. Uninstall: the operator goes; the CRDs, their guard and the PDDeployment stay.
    helm("uninstall", RELEASE, "--wait")
    assert read(apps.read_namespaced_deployment, "pdmtp-operator", namespace) is None
    assert read(core.read_namespaced_service_account, "pdmtp-operator", namespace) is None
    assert read(rbac.read_cluster_role, "pdmtp-operator") is None
    assert read(rbac.read_namespaced_role_binding, "pdmtp-operator", namespace) is None
    for name in CRDS:
        assert crd_metadata(api, name) is not None, f"{name} was deleted"
    assert guard_present(api)
    assert get_pdd(api, namespace, "kept")["metadata"]["name"] == "kept"

    # 5. Purge: install again (the kept objects are still the release's), crds.keep=false,
    #    uninstall. The CRDs consent to deletion, and their PDDeployments go with them.
    #    The install as the README writes it: a registry's repository, the tag defaulting to the
    #    chart's appVersion (= pdmtp's version).
    helm("install", RELEASE, chart, "--create-namespace", "--set", f"image.repository={REGISTRY}")
    image = apps.read_namespaced_deployment("pdmtp-operator", namespace).spec.template.spec
    assert image.containers[0].image == f"{REGISTRY}:{pdmtp.__version__}"
    helm("upgrade", RELEASE, chart, "--reuse-values", "--set", "crds.keep=false")
    for name in CRDS:
        meta = crd_metadata(api, name)
        assert meta is not None
        assert (meta.annotations or {}).get(ALLOW_DELETE) == "true"
        assert KEEP not in (meta.annotations or {})
    helm("uninstall", RELEASE, "--wait")
    wait_for(
        lambda: all(crd_metadata(api, name) is None for name in CRDS), "the CRDs deleted", 60, 0.5
    )
    assert not guard_present(api)
    assert read(rbac.read_cluster_role, "pdmtp-operator") is None

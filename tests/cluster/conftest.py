"""Cluster tier: a real Kubernetes API, one per session.

PDMTP_CLUSTER selects the backend:
  local    (default) start hack/lib/localcluster.py in a temp dir: etcd, kube-apiserver,
           kube-controller-manager, kube-scheduler and KWOK fake GPU nodes, all on 127.0.0.1
  existing whatever $KUBECONFIG points at, else .cluster/kubeconfig (`make cluster-up`)
  kind     a kind cluster's $KUBECONFIG; KWOK with hack/kwok/ stages and fake GPU nodes must be
           installed there for the scheduling tests to pass

Missing infrastructure skips the tier, or fails it when PDMTP_REQUIRE_ALL=1.
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from cluster.kubehelpers import Cluster, install_crd, kubeconfig_server, wait_for
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from localcluster import ClusterError, LocalCluster, default_bin_dir, missing_binaries
from loopback import is_loopback_url
from operator_harness import OperatorProcess, objects_dump

__all__ = ["Cluster", "install_crd", "wait_for"]

REPO = Path(__file__).resolve().parents[2]
_local: LocalCluster | None = None  # the session's launcher, for failure diagnostics


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.cluster)
    # The KEDA test last when the whole directory runs: it builds KEDA (or waits for the background
    # build of `make test`), which on a cold machine takes longer than the rest of the tier.
    items.sort(key=lambda item: Path(str(item.path)).name == "test_keda.py")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and _local is not None:
        report.sections.append(
            (f"control plane logs ({_local.log_dir})", _local.log_tails(lines=20))
        )
    return report


def _unavailable(why: str) -> None:
    if os.environ.get("PDMTP_REQUIRE_ALL") == "1":
        pytest.fail(f"cluster tier required (PDMTP_REQUIRE_ALL=1): {why}", pytrace=False)
    pytest.skip(why)


def _loopback_only(kubeconfig: Path) -> None:
    # Network rule: tests talk to loopback only, whatever cluster the kubeconfig names.
    server = kubeconfig_server(kubeconfig)
    if not server:
        _unavailable(f"{kubeconfig} names no cluster")
    if not is_loopback_url(server):
        pytest.fail(f"{kubeconfig}: server {server!r} is not loopback; refusing to test against it")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    global _local
    backend = os.environ.get("PDMTP_CLUSTER", "local")
    local: LocalCluster | None = None
    started = False
    if backend == "local":
        missing = missing_binaries()
        if missing:
            _unavailable(
                f"control-plane binaries missing in {default_bin_dir()} ({', '.join(missing)}); "
                "run `make cluster-bins`"
            )
        local = LocalCluster(tmp_path_factory.mktemp("cluster"), nodes=4, die_with_parent=True)
        try:
            local.start()
        except ClusterError as exc:
            pytest.fail(f"local control plane did not start: {exc}", pytrace=False)
        started = True
        kubeconfig = local.kubeconfig
        print(f"\nlocal control plane up in {local.timings['total']:.1f}s", file=sys.stderr)
    elif backend in ("existing", "kind"):
        env = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
        kubeconfig = Path(env) if env else REPO / ".cluster" / "kubeconfig"
        if not kubeconfig.exists():
            _unavailable(f"PDMTP_CLUSTER={backend} but no kubeconfig at {kubeconfig}")
        _loopback_only(kubeconfig)
        # A `make cluster-up` cluster: reuse its launcher for logs and binaries, never stop it.
        state = kubeconfig.parent / "state.json"
        if state.exists():
            local = LocalCluster(kubeconfig.parent)
            local.bin_dir = Path(local.load_state().get("bin_dir", local.bin_dir))
    else:
        pytest.fail(f"PDMTP_CLUSTER={backend!r}: expected local, existing or kind", pytrace=False)

    _local = local
    api_client = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        yield Cluster(kubeconfig, api_client, backend, local)
    finally:
        api_client.close()
        _local = None
        if local is not None and started:
            try:
                local.stop()
            except Exception:
                print(local.log_tails(), file=sys.stderr)
                raise
            leftover = local.running_pids()
            assert not leftover, f"control-plane processes survived teardown: {leftover}"


@pytest.fixture
def core(cluster: Cluster) -> client.CoreV1Api:
    return client.CoreV1Api(cluster.api_client)


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test; deleted afterwards without waiting."""
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t-{base}-{uuid.uuid4().hex[:6]}"
    api = client.CoreV1Api(cluster.api_client)
    api.create_namespace({"metadata": {"name": name, "labels": {"pdmtp.io/test": "true"}}})
    # Pods need the namespace's default ServiceAccount (admission), which arrives asynchronously.
    wait_for(lambda: api.read_namespaced_service_account("default", name), "default SA", 30)
    yield name
    try:
        api.delete_namespace(name)
    except ApiException as exc:
        if exc.status != 404:
            raise


@pytest.fixture(scope="session")
def crd(cluster: Cluster) -> None:
    """The product CRDs, installed once per session and served."""
    install_crd(cluster.api_client, REPO / "crds" / "pdmtp.io_pddeployments.yaml")
    install_crd(cluster.api_client, REPO / "crds" / "pdmtp.io_pdrolescales.yaml")


@pytest.fixture
def operator(
    cluster: Cluster, crd: None, namespace: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """`pdmtp run` watching the test's namespace."""
    op = OperatorProcess(cluster.kubeconfig, [namespace], tmp_path / "operator.log")
    op.start()
    yield op
    op.stop()
    # pytest shows a test's captured output only when it fails: then this explains the failure.
    print("---- operator log ----\n" + op.log_tail(150))
    print("---- namespace ----\n" + "\n".join(objects_dump(cluster.api_client, namespace)))

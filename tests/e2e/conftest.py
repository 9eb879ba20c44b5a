"""kind e2e tier: the operator installed from deploy/ on a kind cluster of a control plane and
three workers, real pods.

hack/kind-e2e.sh (`make kind-e2e`) builds the images and the node image, creates the cluster,
installs CoreDNS, gives the node fake `nvidia.com/gpu` capacity, loads the images and installs
the operator with `kubectl apply --server-side -k`, then runs this tier with PDMTP_CLUSTER=kind,
KUBECONFIG and the PDMTP_E2E_* image names set. Without them the tier skips, or fails under
PDMTP_REQUIRE_ALL=1.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster.kubehelpers import kubeconfig_server
from e2e.kindkit import Images, Kind, KubectlError, LoadRun, Upgrade
from localcluster import default_bin_dir
from loopback import is_loopback_url

_kind: Kind | None = None
_namespaces: list[str] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and _kind is not None:
        namespace = _namespaces[-1] if _namespaces else None
        report.sections.append(("kind cluster", _kind.diagnostics(namespace)))
    return report


def _unavailable(why: str) -> None:
    if os.environ.get("PDMTP_REQUIRE_ALL") == "1":
        pytest.fail(f"kind e2e required (PDMTP_REQUIRE_ALL=1): {why}", pytrace=False)
    pytest.skip(why)


def _loopback_only(kubeconfig: Path) -> None:
    server = kubeconfig_server(kubeconfig)
    if not is_loopback_url(server):
        pytest.fail(f"{kubeconfig}: server {server!r} is not on loopback; refusing to test it")


@pytest.fixture(scope="session")
def kind() -> Iterator[Kind]:
    global _kind
    if os.environ.get("PDMTP_CLUSTER") != "kind":
        _unavailable("PDMTP_CLUSTER is not kind: run `make kind-e2e` (hack/kind-e2e.sh)")
    kubeconfig = Path(os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or "/nonexistent")
    if not kubeconfig.is_file():
        _unavailable(f"no kubeconfig at {kubeconfig}")
    _loopback_only(kubeconfig)
    kubectl = os.environ.get("PDMTP_KUBECTL") or str(default_bin_dir() / "kubectl")
    if not shutil.which(kubectl):
        _unavailable(f"no kubectl at {kubectl}")
    try:
        images = Images.from_env(os.environ)
    except LookupError as exc:
        _unavailable(str(exc))
        raise
    cluster = Kind(kubeconfig, kubectl, images)
    try:
        cluster.kubectl("get", "--raw", "/readyz")
    except KubectlError as exc:
        _unavailable(f"kind API server not ready: {exc}")
    _kind = cluster
    yield cluster
    _kind = None


def new_namespace(kind: Kind, hint: str) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", hint.lower()).strip("-")[:30].strip("-")
    name = f"e2e-{base}-{uuid.uuid4().hex[:5]}"
    kind.kubectl("create", "namespace", name)
    kind.kubectl("label", "namespace", name, "pdmtp.io/test=e2e")
    _namespaces.append(name)
    return name


@pytest.fixture(scope="module")
def namespace(kind: Kind, request: pytest.FixtureRequest) -> Iterator[str]:
    """One namespace per test module (the module's tests build on each other), deleted after."""
    name = new_namespace(kind, Path(str(request.path)).stem.removeprefix("test_"))
    yield name
    kind.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def loads(kind: Kind, namespace: str) -> Iterator[Callable[..., LoadRun]]:
    """Starts load clients in the module's namespace (`LoadRun.start`'s arguments but the first
    two) and stops any still sending when the test ends, failed or not: a client left running
    would be the next test's load too."""
    runs: list[LoadRun] = []

    def start(service: str, **options: Any) -> LoadRun:
        run = LoadRun.start(kind, namespace, service, **options)
        runs.append(run)
        return run

    yield start
    for run in runs:
        with contextlib.suppress(KubectlError):  # it has ended already
            run.stop()


@pytest.fixture(scope="session")
def upgrade(kind: Kind) -> Upgrade:
    """The previous release to upgrade from (tree, image), helm, and the install overlay."""
    try:
        return Upgrade.from_env(os.environ)
    except LookupError as exc:
        _unavailable(f"upgrade inputs: {exc}")
        raise

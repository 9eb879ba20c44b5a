"""The operator image: the offline CLI works, it runs as a fixed non-root uid, and `pdmtp run`
reconciles against a real API server with its liveness and metrics endpoints answering.

It runs as deploy/operator/operator.yaml runs it: read-only root (podman's --read-only gives it a
tmpfs /tmp, the manifest an emptyDir), no capabilities. The API server is the local control plane
(hack/lib/localcluster.py) on 127.0.0.1; the container shares the host's network namespace
and binds its endpoints to 127.0.0.1.
"""

from __future__ import annotations

import os
import time
import tomllib
import urllib.error
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from image_harness import Podman, http_get, wait_http_ok
from localcluster import ClusterError, LocalCluster, default_bin_dir, missing_binaries
from loopback import free_ports

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "samples"
CRD = REPO / "crds" / "pdmtp.io_pddeployments.yaml"
POD_LIKE = ("--read-only", "--cap-drop=ALL", "--security-opt=no-new-privileges")


def pdmtp(podman: Podman, image: str, *args: str, options: tuple[str, ...] = ()) -> Any:
    return podman.run(image, args, options=[*POD_LIKE, "--entrypoint=pdmtp", *options])


def test_cli_help(podman: Podman, operator_image: str) -> None:
    result = pdmtp(podman, operator_image, "--help")
    assert result.returncode == 0, result.output
    for command in ("run", "validate", "render", "plan", "crd"):
        assert command in result.output


def test_the_image_carries_this_source(podman: Podman, operator_image: str) -> None:
    """The CRD the image generates is the committed one: the image holds today's operator, not
    a layer cached from an older build."""
    result = pdmtp(podman, operator_image, "crd")
    assert result.returncode == 0, result.output
    assert result.output == CRD.read_text(), "the image's operator is not this source"


def test_the_image_carries_the_release_version(podman: Podman, operator_image: str) -> None:
    """Tag, OCI label and the code's own --version all name pyproject.toml's version."""
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert operator_image.endswith(f":{version}"), operator_image
    labels = podman.image_config(operator_image).get("Labels") or {}
    assert labels.get("org.opencontainers.image.version") == version, labels
    result = pdmtp(podman, operator_image, "--version")
    assert result.returncode == 0 and result.output.strip() == f"pdmtp {version}", result.output


def test_validate_accepts_a_sample_and_rejects_a_broken_one(
    podman: Podman, operator_image: str, tmp_path: Path
) -> None:
    result = pdmtp(
        podman,
        operator_image,
        "validate",
        "/samples/demo.yaml",
        options=(f"--volume={SAMPLES}:/samples:ro",),
    )
    assert result.returncode == 0, result.output
    assert "compatible" in result.output

    # Tensor-parallel sizes that do not divide one another: the CLI in the image must say no.
    broken = yaml.safe_load((SAMPLES / "demo.yaml").read_text())
    broken["spec"]["prefill"]["tensorParallelSize"] = 4
    broken["spec"]["decode"]["tensorParallelSize"] = 3
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(broken))
    tmp_path.chmod(0o755)
    (tmp_path / "broken.yaml").chmod(0o644)
    result = pdmtp(
        podman,
        operator_image,
        "validate",
        "/in/broken.yaml",
        options=(f"--volume={tmp_path}:/in:ro",),
    )
    assert result.returncode != 0, result.output
    assert "tensor" in result.output.lower(), result.output


def test_runs_as_a_fixed_non_root_uid(podman: Podman, operator_image: str) -> None:
    assert podman.image_config(operator_image)["User"] == "65532:65532"
    result = podman.run(operator_image, ["-c", "id -u; id -g"], options=["--entrypoint=sh"])
    assert result.returncode == 0, result.output
    assert result.output.split() == ["65532", "65532"]


# ---- against a real API server ---------------------------------------------------------------


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    missing = missing_binaries()
    if missing:
        message = (
            f"control-plane binaries missing in {default_bin_dir()} ({', '.join(missing)}); "
            "run `make cluster-bins`"
        )
        if os.environ.get("PDMTP_REQUIRE_ALL") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    cluster = LocalCluster(tmp_path_factory.mktemp("cluster"), nodes=1, die_with_parent=True)
    try:
        cluster.start()
    except ClusterError as error:
        pytest.fail(f"local control plane did not start: {error}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


def install_crd(cluster: LocalCluster) -> None:
    crd = yaml.safe_load(CRD.read_text())
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    cluster.api("POST", crds, crd)
    name = crd["metadata"]["name"]
    group, version = crd["spec"]["group"], crd["spec"]["versions"][0]["name"]
    plural = crd["spec"]["names"]["plural"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            # Established, and served: a list succeeds.
            got = cluster.api("GET", f"{crds}/{name}")
            listed = (got.get("status") or {}).get("conditions") or []
            conditions = {c["type"]: c["status"] for c in listed}
            if conditions.get("Established") == "True":
                cluster.api("GET", f"/apis/{group}/{version}/{plural}")
                return
        except urllib.error.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"CRD {name} not established and served within 30s")


def test_reconciles_with_liveness_and_metrics_answering(
    podman: Podman, operator_image: str, control_plane: LocalCluster, tmp_path: Path
) -> None:
    install_crd(control_plane)
    # The image's user must read the kubeconfig; a copy, so the cluster's stays private.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(control_plane.kubeconfig.read_text())
    kubeconfig.chmod(0o644)
    tmp_path.chmod(0o755)
    metrics_port, liveness_port = free_ports(2)
    name = podman.start(
        operator_image,
        [
            "--kubeconfig=/kube/config",
            "--metrics-address=127.0.0.1",
            f"--metrics-port={metrics_port}",
            f"--health-listen=127.0.0.1:{liveness_port}",
            "--namespace=default",
        ],
        network="host",
        options=[*POD_LIKE, f"--volume={kubeconfig}:/kube/config:ro"],
    )

    def alive() -> bool:
        return podman.running(name)

    def logs() -> str:
        return podman.logs(name)[-6000:]

    content_type, _ = wait_http_ok(
        f"http://127.0.0.1:{liveness_port}/healthz", timeout=60, alive=alive, describe=logs
    )
    assert content_type == "application/json", "the operator's liveness answers JSON"
    # The log starts with the build that runs (what to look for after an upgrade).
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    first = podman.logs(name).splitlines()[0]
    assert f"pdmtp {version} starting" in first and "watching default" in first, first

    # Real work: the operator in the container writes the status of a PDDeployment.
    body = yaml.safe_load((SAMPLES / "minimal.yaml").read_text())
    path = "/apis/pdmtp.io/v1alpha1/namespaces/default/pddeployments"
    created = control_plane.api("POST", path, body)
    generation = created["metadata"]["generation"]
    deadline = time.monotonic() + 60
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = control_plane.api("GET", f"{path}/{body['metadata']['name']}").get("status", {})
        if status.get("observedGeneration") == generation:
            break
        time.sleep(0.5)
    assert status.get("observedGeneration") == generation, f"status {status}\n{logs()}"

    status_code, _, metrics = http_get(f"http://127.0.0.1:{metrics_port}/metrics")
    assert status_code == 200
    reconciles = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("pdmtp_reconcile_total{")
    ]
    assert sum(reconciles) >= 1, metrics[:2000]
    assert alive(), logs()

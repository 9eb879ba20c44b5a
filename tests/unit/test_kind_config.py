"""The kind clusters turn the Workload API on exactly as the local control plane does: the gates
and API version of their Kubernetes version's row in `localcluster.workload_api()` (the pinned
version for the node image built here; the published image's for the docker path)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from localcluster import K8S_VERSION, workload_api

REPO = Path(__file__).resolve().parents[2]


def published_node_version() -> str:
    """The Kubernetes version of the published node image the docker path runs by default."""
    found = re.search(r"kindest/node:(v[0-9.]+)@", (REPO / "hack/kind-e2e.sh").read_text())
    assert found, "hack/kind-e2e.sh names no default kindest/node image"
    return found[1]


CONFIGS = {
    "hack/kind/cluster.yaml": K8S_VERSION,
    "hack/kind/cluster-docker.yaml": published_node_version(),
}


@pytest.mark.parametrize("config", CONFIGS)
def test_kind_serves_the_workload_api_of_its_version(config: str) -> None:
    version = CONFIGS[config]
    api = workload_api(version)
    assert api is not None, f"no Workload API row for {version} in localcluster.workload_api"
    doc = yaml.safe_load((REPO / config).read_text())
    assert doc["featureGates"] == {gate: True for gate in api.feature_gates}
    assert doc["runtimeConfig"] == {api.group_version: "true"}


def test_both_runtimes_make_the_same_nodes() -> None:
    """tests/e2e places a two-node group beside a single-node role and a surge group beside the
    old one: both kind configs make a control plane and three workers."""
    for config in CONFIGS:
        doc = yaml.safe_load((REPO / config).read_text())
        roles = [node["role"] for node in doc["nodes"]]
        assert roles == ["control-plane", "worker", "worker", "worker"], config

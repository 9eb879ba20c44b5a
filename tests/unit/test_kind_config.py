"""The kind clusters turn the Workload API on exactly as the local control plane does: the gates
and API version of the pinned Kubernetes version's row in `localcluster.workload_api()`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from localcluster import K8S_VERSION, workload_api

REPO = Path(__file__).resolve().parents[2]
CONFIGS = ("hack/kind/cluster.yaml", "hack/kind/cluster-docker.yaml")


@pytest.mark.parametrize("config", CONFIGS)
def test_kind_serves_the_workload_api_of_the_pinned_version(config: str) -> None:
    api = workload_api(K8S_VERSION)
    assert api is not None, f"no Workload API row for {K8S_VERSION} in localcluster.workload_api"
    doc = yaml.safe_load((REPO / config).read_text())
    assert doc["featureGates"] == {gate: True for gate in api.feature_gates}
    assert doc["runtimeConfig"] == {api.group_version: "true"}

"""The check every cluster-facing tier makes before it talks to a server: loopback or nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from cluster.kubehelpers import kubeconfig_server
from loopback import is_loopback_url


@pytest.mark.parametrize(
    ("url", "loopback"),
    [
        ("https://127.0.0.1:6443", True),
        ("https://127.3.4.5", True),
        ("https://[::1]:6443", True),
        ("https://localhost:6443", True),
        ("https://10.96.0.1:443", False),
        ("https://192.0.2.7:6443", False),
        ("https://api.example.com", False),
        ("https://[2001:db8::1]:6443", False),
        ("", False),
    ],
)
def test_only_loopback_hosts_pass(url: str, loopback: bool) -> None:
    assert is_loopback_url(url) is loopback


def test_the_server_is_the_current_contexts(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    doc = {
        "clusters": [
            {"name": "far", "cluster": {"server": "https://192.0.2.7:6443"}},
            {"name": "near", "cluster": {"server": "https://127.0.0.1:6443"}},
        ],
        "contexts": [
            {"name": "a", "context": {"cluster": "far"}},
            {"name": "b", "context": {"cluster": "near"}},
        ],
        "current-context": "b",
    }
    kubeconfig.write_text(yaml.safe_dump(doc))
    assert kubeconfig_server(kubeconfig) == "https://127.0.0.1:6443"
    doc["current-context"] = "a"
    kubeconfig.write_text(yaml.safe_dump(doc))
    assert kubeconfig_server(kubeconfig) == "https://192.0.2.7:6443"


def test_a_kubeconfig_without_a_current_cluster_names_no_server(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    assert kubeconfig_server(kubeconfig) == ""

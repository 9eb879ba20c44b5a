"""The in-cluster args, read back by vllm-router 0.1.17's own command-line parser."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from pdmtp.api.vocabulary import ROUTER_HTTP_PORT, ROUTER_METRICS_PORT, ROUTER_POLICIES
from pdmtp.core.render.membership import Membership, Prefill
from pdmtp.core.render.router import router_args


@pytest.fixture
def launcher(router_binary: Path) -> Any:
    # Only meaningful for the pinned wheel; router_binary skips or fails when it is absent.
    return pytest.importorskip("vllm_router.launch_router")


def membership() -> Membership:
    return Membership(
        prefills=(
            Prefill("http://198.51.100.1:8000", 8998),
            Prefill("http://[2001:db8::2]:8000", 9000),
        ),
        decodes=("http://203.0.113.1:8000",),
        token="t",
    )


@pytest.mark.parametrize("policy", ROUTER_POLICIES)
def test_router_reads_the_rendered_args_as_meant(launcher: Any, policy: str) -> None:
    parsed = launcher.parse_router_args(router_args(membership=membership(), policy=policy))
    assert parsed.vllm_pd_disaggregation is True
    assert parsed.kv_connector == "mooncake"
    assert parsed.policy == policy
    assert parsed.prefill_policy is None and parsed.decode_policy is None
    assert parsed.prefill_urls == [
        ("http://198.51.100.1:8000", 8998),
        ("http://[2001:db8::2]:8000", 9000),
    ]
    assert parsed.decode_urls == ["http://203.0.113.1:8000"]
    assert (parsed.host, parsed.port) == ("0.0.0.0", ROUTER_HTTP_PORT)
    assert (parsed.prometheus_host, parsed.prometheus_port) == ("0.0.0.0", ROUTER_METRICS_PORT)
    assert parsed.service_discovery is False
    # Health probes every second, one failure drops a worker (test_router_failover.py); retries
    # and the circuit breaker keep 0.1.17's defaults, which the P/D path never consults.
    assert (parsed.health_check_interval_secs, parsed.health_failure_threshold) == (1, 1)
    assert parsed.health_check_timeout_secs == 2
    assert parsed.health_check_endpoint == "/health"
    assert parsed.disable_retries is False and parsed.disable_circuit_breaker is False
    parsed._validate_router_args()


def test_policy_enum_is_within_the_routers_choices(launcher: Any) -> None:
    parser = argparse.ArgumentParser()
    launcher.RouterArgs.add_cli_args(parser)
    choices = next(a.choices for a in parser._actions if a.dest == "policy")
    assert choices is not None
    assert set(ROUTER_POLICIES) <= set(choices)


def test_bootstrap_annotation_key_is_fixed_by_the_launcher(launcher: Any) -> None:
    """0.1.17 has no flag for the annotation its discovery reads (docs/router.md)."""
    parsed = launcher.parse_router_args(["--vllm-pd-disaggregation", "--service-discovery"])
    assert parsed.bootstrap_port_annotation == "vllm.ai/bootstrap-port"
    assert parsed.service_discovery_port == 80

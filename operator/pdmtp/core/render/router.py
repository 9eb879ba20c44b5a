"""The per-revision vllm-router's command line, in one place.

vllm-router 0.1.17 (PyPI `vllm-router`) speaks vLLM's Mooncake P/D protocol. Its Kubernetes
service discovery registers prefill pods without ever asking their bootstrap server for an
engine_id, and it asks each static prefill exactly once, at start-up (see docs/router.md). So the
in-cluster router is started with static per-pod URLs of exactly one revision, and the operator
restarts it (a new pod template) whenever that set changes or a prefill engine restarts.

`static_router_args` is the single renderer: the operator calls it through `router_args`, and the
router tests start the real binary with its output against emulated engines.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from pdmtp.api.vocabulary import ROUTER_HTTP_PORT, ROUTER_METRICS_PORT, ROUTER_POLICIES
from pdmtp.core.render.membership import Membership, Prefill

ROUTER_READINESS_PATH: Final = "/readiness"
"""The readinessProbe path. The router listens only after its start-up health wait and every
prefill's `/query`; the body counts healthy prefills and decodes."""
ROUTER_LIVENESS_PATH: Final = "/liveness"

# Active health checks, the only failover 0.1.17's P/D mode has. Its P/D path sends a request to
# one prefill and one decode, once: `--retry-*` and the circuit breaker are never consulted there
# (read in its source; with retries 3 and a breaker at 1 failure not one failure fewer,
# tests/router/test_router_failover.py). It does pick only among workers its health checker holds
# healthy. At the defaults (a probe every 60 s, 3 failures) a killed engine of a 2P/2D revision
# failed every other request until the operator rolled the router; probing every second, one
# failure drops it within a second (docs/benchmarks.md, "Router retries (issue 31)"). Two good
# probes (the default) take it back; a live engine is dropped only if its /health stalls 2 s.
ROUTER_HEALTH_FLAGS: Final[tuple[str, ...]] = (
    "--health-check-interval-secs",
    "1",
    "--health-failure-threshold",
    "1",
    "--health-check-timeout-secs",
    "2",
)

# Rendered for every router. The start-up health poll defaults to every 30 s; at 1 s a rolled
# router is Ready within seconds of its engines being healthy.
_COMMON_FLAGS: Final[tuple[str, ...]] = (
    "--vllm-pd-disaggregation",
    "--kv-connector",
    "mooncake",
    "--worker-startup-check-interval",
    "1",
    *ROUTER_HEALTH_FLAGS,
)


def static_router_args(
    *,
    prefills: Sequence[Prefill | tuple[str, int]],
    decodes: Sequence[str],
    policy: str,
    host: str,
    port: int,
    metrics_host: str,
    metrics_port: int,
    log_level: str = "info",
) -> list[str]:
    """vllm-router arguments (without the binary) for fixed prefill and decode URLs.

    `prefills` are (engine URL, Mooncake bootstrap port) pairs: the router queries
    `http://<url host>:<bootstrap port>/query` once at start-up for the engine ids.
    """
    if policy not in ROUTER_POLICIES:
        raise ValueError(f"unknown router policy {policy!r}; expected one of {ROUTER_POLICIES}")
    if not prefills or not decodes:
        raise ValueError("a P/D router needs at least one prefill and one decode")
    args = [*_COMMON_FLAGS, "--policy", policy]
    for p in prefills:
        url, boot = (p.url, p.bootstrap_port) if isinstance(p, Prefill) else p
        args += ["--prefill", url, str(boot)]
    for url in decodes:
        args += ["--decode", url]
    args += [
        "--host",
        host,
        "--port",
        str(port),
        "--prometheus-host",
        metrics_host,
        "--prometheus-port",
        str(metrics_port),
        "--log-level",
        log_level,
    ]
    return args


def router_args(*, membership: Membership, policy: str) -> list[str]:
    """The in-cluster router container's args: listens on all interfaces on the fixed ports."""
    return static_router_args(
        prefills=membership.prefills,
        decodes=membership.decodes,
        policy=policy,
        host="0.0.0.0",
        port=ROUTER_HTTP_PORT,
        metrics_host="0.0.0.0",
        metrics_port=ROUTER_METRICS_PORT,
    )

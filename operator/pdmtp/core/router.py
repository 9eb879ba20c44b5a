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

import hashlib
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pdmtp.core.vocabulary import (
    ANNOTATION_BOOTSTRAP_PORT,
    ENGINE_HTTP_PORT,
    ENGINE_ROLES,
    LABEL_NAME,
    LABEL_REVISION,
    LABEL_ROLE,
    ROUTER_HTTP_PORT,
    ROUTER_METRICS_PORT,
)

ROUTER_VERSION: Final = "0.1.17"
ROUTER_BINARY: Final = "vllm-router"

ROUTER_POLICIES: Final[tuple[str, ...]] = ("round_robin", "random", "cache_aware", "power_of_two")
"""spec.router.policy values: the 0.1.17 `--policy` choices that need no extra inputs.

kv_aware needs KV event sources, consistent_hash and sticky_least_loaded need session keys from
the client; none of those is modelled by the CRD.
"""

ROUTER_READINESS_PATH: Final = "/readiness"
"""The readinessProbe path. The router listens only after its start-up health wait and every
prefill's `/query`; the body counts healthy prefills and decodes."""
ROUTER_LIVENESS_PATH: Final = "/liveness"

DEFAULT_BOOTSTRAP_PORT: Final = 8998
"""vLLM's VLLM_MOONCAKE_BOOTSTRAP_PORT default; also what the router assumes when given none."""

ROUTER_RBAC_RULES: Final[tuple[Mapping[str, Any], ...]] = ()
"""Role rules for the router's ServiceAccount: none. The static router never calls the Kubernetes
API, so it gets no Role and should run with automountServiceAccountToken: false. (0.1.17's
discovery mode lists and watches pods; it is not used, see docs/router.md.)"""

# Rendered for every router. The start-up health poll defaults to every 30 s; at 1 s a rolled
# router is Ready within seconds of its engines being healthy.
_COMMON_FLAGS: Final[tuple[str, ...]] = (
    "--vllm-pd-disaggregation",
    "--kv-connector",
    "mooncake",
    "--worker-startup-check-interval",
    "1",
)


@dataclass(frozen=True, order=True)
class Prefill:
    """A prefill engine as the router addresses it."""

    url: str
    bootstrap_port: int


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


# ---- the in-cluster form -------------------------------------------------------------------


@dataclass(frozen=True)
class Membership:
    """The engines one revision's router may route to, read from observed pods."""

    prefills: tuple[Prefill, ...]
    decodes: tuple[str, ...]
    token: str
    """Changes whenever the router must restart: membership, or a prefill engine restarted."""

    @property
    def routable(self) -> bool:
        return bool(self.prefills) and bool(self.decodes)


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def _engine_url(ip: str) -> str:
    host = f"[{ip}]" if ipaddress.ip_address(ip).version == 6 else ip
    return f"http://{host}:{ENGINE_HTTP_PORT}"


def _restarts(pod: Mapping[str, Any]) -> int:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return sum(int(s.get("restartCount", 0)) for s in statuses)


def revision_membership(
    pods: Iterable[Mapping[str, Any]],
    *,
    deployment_name: str,
    revision: str,
    bootstrap_port: int = DEFAULT_BOOTSTRAP_PORT,
) -> Membership:
    """Pick the Ready engine pods of exactly one (deployment, revision) from pod objects (dicts).

    A pod of another revision or deployment is never selected, whatever else it carries, so a
    router can never pair across revisions. The order is stable (sorted), so the same pods always
    render the same arguments and an unchanged revision never rolls its router.
    """
    prefills: list[Prefill] = []
    decodes: list[str] = []
    identity: list[str] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(LABEL_NAME) != deployment_name or labels.get(LABEL_REVISION) != revision:
            continue
        role = labels.get(LABEL_ROLE)
        ip = (pod.get("status") or {}).get("podIP")
        if role not in ENGINE_ROLES or not ip or not _pod_ready(pod):
            continue
        url = _engine_url(ip)
        if role == "prefill":
            annotated = (meta.get("annotations") or {}).get(ANNOTATION_BOOTSTRAP_PORT)
            port = int(annotated) if annotated else bootstrap_port
            prefills.append(Prefill(url, port))
            # vLLM mints a new engine_id whenever a prefill engine starts; the router learns ids
            # only at its own start, so a prefill container restart must restart the router.
            identity.append(f"p {url} {port} {meta.get('uid', '')} {_restarts(pod)}")
        else:
            decodes.append(url)
            identity.append(f"d {url}")
    token = hashlib.sha256("\n".join(sorted(identity)).encode()).hexdigest()[:16]
    return Membership(tuple(sorted(prefills)), tuple(sorted(decodes)), token)


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

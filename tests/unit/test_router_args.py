"""pdmtp.core.render.router: the router's args and the per-revision membership they are rendered
from."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pdmtp.api.vocabulary import (
    ANNOTATION_BOOTSTRAP_PORT,
    ANNOTATION_LEAVING,
    DEFAULT_BOOTSTRAP_PORT,
    ENGINE_HTTP_PORT,
    LABEL_NAME,
    LABEL_REVISION,
    LABEL_ROLE,
    ROUTER_HTTP_PORT,
    ROUTER_METRICS_PORT,
    ROUTER_POLICIES,
)
from pdmtp.core.objects import name_of
from pdmtp.core.render.membership import Membership, Prefill, revision_membership
from pdmtp.core.render.router import ROUTER_HEALTH_FLAGS, router_args, static_router_args


def pod(
    ip: str | None,
    role: str,
    *,
    name: str = "demo",
    revision: str = "r1",
    ready: bool = True,
    phase: str = "Running",
    restarts: int = 0,
    uid: str = "u",
    bootstrap: str | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": f"{role}-{ip}",
        "uid": uid,
        "labels": {LABEL_NAME: name, LABEL_ROLE: role, LABEL_REVISION: revision},
    }
    if bootstrap is not None:
        meta["annotations"] = {ANNOTATION_BOOTSTRAP_PORT: bootstrap}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [{"name": "engine", "restartCount": restarts}],
    }
    if ip is not None:
        status["podIP"] = ip
    return {"metadata": meta, "status": status}


def test_static_args_exact() -> None:
    args = static_router_args(
        prefills=[("http://198.51.100.1:8000", 8998), Prefill("http://198.51.100.2:8000", 9000)],
        decodes=["http://203.0.113.1:8000"],
        policy="power_of_two",
        host="127.0.0.1",
        port=30000,
        metrics_host="127.0.0.1",
        metrics_port=29001,
    )
    assert args == [
        "--vllm-pd-disaggregation",
        "--kv-connector",
        "mooncake",
        "--worker-startup-check-interval",
        "1",
        "--health-check-interval-secs",
        "1",
        "--health-failure-threshold",
        "1",
        "--health-check-timeout-secs",
        "2",
        "--policy",
        "power_of_two",
        "--prefill",
        "http://198.51.100.1:8000",
        "8998",
        "--prefill",
        "http://198.51.100.2:8000",
        "9000",
        "--decode",
        "http://203.0.113.1:8000",
        "--host",
        "127.0.0.1",
        "--port",
        "30000",
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        "29001",
        "--log-level",
        "info",
    ]


def test_unknown_policy_and_empty_roles_are_refused() -> None:
    ok: dict[str, Any] = {
        "prefills": [("http://p:8000", 8998)],
        "decodes": ["http://d:8000"],
        "policy": "round_robin",
        "host": "h",
        "port": 1,
        "metrics_host": "h",
        "metrics_port": 2,
    }
    static_router_args(**ok)
    with pytest.raises(ValueError, match="policy"):
        static_router_args(**{**ok, "policy": "kv_aware"})
    with pytest.raises(ValueError, match="prefill"):
        static_router_args(**{**ok, "prefills": []})
    with pytest.raises(ValueError, match="decode"):
        static_router_args(**{**ok, "decodes": []})


def test_policies_are_a_fixed_enum() -> None:
    assert ROUTER_POLICIES == ("round_robin", "random", "cache_aware", "power_of_two")


def test_in_cluster_args_listen_on_the_fixed_ports() -> None:
    m = revision_membership(
        [pod("198.51.100.1", "prefill"), pod("203.0.113.1", "decode")],
        deployment_name="demo",
        revision="r1",
    )
    args = router_args(membership=m, policy="cache_aware")
    assert args[args.index("--host") + 1] == "0.0.0.0"
    assert args[args.index("--port") + 1] == str(ROUTER_HTTP_PORT)
    assert args[args.index("--prometheus-host") + 1] == "0.0.0.0"
    assert args[args.index("--prometheus-port") + 1] == str(ROUTER_METRICS_PORT)
    i = args.index("--prefill")
    assert args[i : i + 3] == [
        "--prefill",
        f"http://198.51.100.1:{ENGINE_HTTP_PORT}",
        str(DEFAULT_BOOTSTRAP_PORT),
    ]
    assert args[args.index("--decode") + 1] == f"http://203.0.113.1:{ENGINE_HTTP_PORT}"


def test_membership_takes_only_ready_running_pods_with_an_ip() -> None:
    pods = [
        pod("198.51.100.1", "prefill"),
        pod("198.51.100.2", "prefill", ready=False),
        pod("198.51.100.3", "prefill", phase="Pending"),
        pod(None, "prefill"),
        pod("198.51.100.4", "prefill", deleting=True),
        pod("203.0.113.1", "decode"),
        pod("203.0.113.2", "router"),
    ]
    m = revision_membership(pods, deployment_name="demo", revision="r1")
    assert m.prefills == (
        Prefill(f"http://198.51.100.1:{ENGINE_HTTP_PORT}", DEFAULT_BOOTSTRAP_PORT),
    )
    assert m.decodes == (f"http://203.0.113.1:{ENGINE_HTTP_PORT}",)
    assert m.routable


def test_membership_leaves_out_pods_leaving_routing() -> None:
    """Marked (observed) or being marked in this step (`leaving`): out of the router's args."""
    marked = pod("203.0.113.2", "decode")
    marked["metadata"].setdefault("annotations", {})[ANNOTATION_LEAVING] = "2026-12-01T00:00:00Z"
    pods = [pod("198.51.100.1", "prefill"), pod("203.0.113.1", "decode"), marked]
    m = revision_membership(pods, deployment_name="demo", revision="r1")
    assert m.decodes == (f"http://203.0.113.1:{ENGINE_HTTP_PORT}",)
    step = revision_membership(
        pods[:2], deployment_name="demo", revision="r1", leaving=frozenset({name_of(pods[1])})
    )
    assert step.decodes == () and not step.routable


def test_membership_reads_the_bootstrap_annotation_and_brackets_ipv6() -> None:
    pods = [pod("fd00::1", "prefill", bootstrap="9100"), pod("fd00::2", "decode")]
    m = revision_membership(pods, deployment_name="demo", revision="r1", bootstrap_port=8998)
    assert m.prefills == (Prefill(f"http://[fd00::1]:{ENGINE_HTTP_PORT}", 9100),)
    assert m.decodes == (f"http://[fd00::2]:{ENGINE_HTTP_PORT}",)


def test_a_revision_without_both_roles_is_not_routable() -> None:
    m = revision_membership([pod("198.51.100.1", "prefill")], deployment_name="demo", revision="r1")
    assert not m.routable
    assert not revision_membership([], deployment_name="demo", revision="r1").routable


def _token(pods: list[dict[str, Any]]) -> str:
    return revision_membership(pods, deployment_name="demo", revision="r1").token


def test_token_changes_when_the_router_must_restart() -> None:
    base = [pod("198.51.100.1", "prefill", uid="a"), pod("203.0.113.1", "decode")]
    t = _token(base)
    # A prefill engine restart mints a new engine_id: the router must re-query.
    assert _token([pod("198.51.100.1", "prefill", uid="a", restarts=1), base[1]]) != t
    # A replaced prefill pod that happens to get the same IP.
    assert _token([pod("198.51.100.1", "prefill", uid="b"), base[1]]) != t
    assert _token([*base, pod("203.0.113.2", "decode")]) != t
    assert _token(base[:1]) != t
    # The router caches nothing about a decode engine: its restart needs no router restart.
    assert _token([base[0], pod("203.0.113.1", "decode", restarts=3)]) == t


IPS = st.integers(1, 250).map(lambda i: f"198.51.100.{i}")
PODS = st.lists(
    st.builds(
        pod,
        IPS,
        st.sampled_from(["prefill", "decode", "router"]),
        name=st.sampled_from(["demo", "other"]),
        revision=st.sampled_from(["r1", "r2"]),
        ready=st.booleans(),
        restarts=st.integers(0, 3),
    ),
    max_size=12,
)


@given(PODS, st.randoms())
def test_never_pairs_across_revisions_and_is_order_independent(
    pods: list[dict[str, Any]], rnd: random.Random
) -> None:
    m = revision_membership(pods, deployment_name="demo", revision="r1")
    wanted = [
        p
        for p in pods
        if p["metadata"]["labels"][LABEL_NAME] == "demo"
        and p["metadata"]["labels"][LABEL_REVISION] == "r1"
        and p["status"]["conditions"][0]["status"] == "True"
    ]
    urls = {f"http://{p['status']['podIP']}:{ENGINE_HTTP_PORT}" for p in wanted}
    selected = {p.url for p in m.prefills} | set(m.decodes)
    assert selected <= urls
    for p in wanted:
        url = f"http://{p['status']['podIP']}:{ENGINE_HTTP_PORT}"
        role = p["metadata"]["labels"][LABEL_ROLE]
        if role == "prefill":
            assert url in {x.url for x in m.prefills}
        elif role == "decode":
            assert url in m.decodes
    shuffled = list(pods)
    rnd.shuffle(shuffled)
    again = revision_membership(shuffled, deployment_name="demo", revision="r1")
    assert isinstance(again, Membership)
    assert (again.prefills, again.decodes, again.token) == (m.prefills, m.decodes, m.token)
    assert list(m.prefills) == sorted(m.prefills) and list(m.decodes) == sorted(m.decodes)


def _flag(args: list[str], name: str) -> str:
    assert args.count(name) == 1, args
    return args[args.index(name) + 1]


def test_every_router_drops_a_dead_engine_within_a_probe() -> None:
    """Active health checks are 0.1.17's only P/D failover (tests/router/test_router_failover.py):
    a probe every second, one failure drops a worker; the retry and circuit-breaker flags do
    nothing on the P/D path and are not rendered."""
    m = revision_membership(
        [pod("198.51.100.1", "prefill"), pod("203.0.113.1", "decode")],
        deployment_name="demo",
        revision="r1",
    )
    for args in (
        router_args(membership=m, policy="round_robin"),
        static_router_args(
            prefills=[("http://127.0.0.1:1", 2)],
            decodes=["http://127.0.0.1:3"],
            policy="random",
            host="127.0.0.1",
            port=4,
            metrics_host="127.0.0.1",
            metrics_port=5,
        ),
    ):
        assert _flag(args, "--health-check-interval-secs") == "1"
        assert _flag(args, "--health-failure-threshold") == "1"
        # A live engine is dropped only if its /health stalls this long (one probe decides).
        assert int(_flag(args, "--health-check-timeout-secs")) >= 2
        assert not [a for a in args if a.startswith(("--retry-", "--cb-", "--disable-"))]
    assert ROUTER_HEALTH_FLAGS[::2] == (
        "--health-check-interval-secs",
        "--health-failure-threshold",
        "--health-check-timeout-secs",
    )

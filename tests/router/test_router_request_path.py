"""The request path through the real vllm-router (pinned) in Mooncake P/D mode.

Every router here is started with `pdmtp.core.render.router.static_router_args`, the function that
also renders the in-cluster router's args, against emulated engines on 127.0.0.1.
"""

from __future__ import annotations

import time

import pytest
from pdmtp.api.vocabulary import ROUTER_POLICIES
from pdmtp.core.render.router import ROUTER_LIVENESS_PATH, ROUTER_READINESS_PATH
from router.emulator import EngineEmulator, EngineFactory, Recorded
from router.harness import RouterFactory, body_for, completion_body, get, post, text_of

PATHS = ("/v1/completions", "/v1/chat/completions")
Pair = tuple[EngineEmulator, EngineEmulator, str]
"""One prefill, one decode, and the base URL of a router over just them."""


def only_generation(emu: EngineEmulator) -> Recorded:
    reqs = emu.generation_requests()
    assert len(reqs) == 1, [r.path for r in reqs]
    return reqs[0]


def assert_paired(prefill: EngineEmulator, p_req: Recorded, d_req: Recorded) -> None:
    """The decode request names this prefill's engine id and bootstrap server, same transfer."""
    p_kv = p_req.body["kv_transfer_params"]
    d_kv = d_req.body["kv_transfer_params"]
    assert p_kv["do_remote_decode"] is True
    assert p_kv["do_remote_prefill"] is False
    assert p_kv["transfer_id"]
    assert d_kv["do_remote_prefill"] is True
    assert d_kv["do_remote_decode"] is False
    assert d_kv["transfer_id"] == p_kv["transfer_id"]
    assert d_kv["remote_engine_id"] == prefill.engine_id
    assert d_kv["remote_bootstrap_addr"] == prefill.bootstrap_addr


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("path", PATHS)
def test_request_is_split_into_prefill_and_decode(
    engine: EngineFactory, start_router: RouterFactory, path: str, stream: bool
) -> None:
    p = engine("prefill", "p0")
    d = engine("decode", "d0")
    router = start_router([p], [d])
    assert p.bootstrap_queries == 1  # asked once, at start-up

    reply = post(router.base, path, body_for(path, stream=stream))

    assert reply.status == 200, reply.body
    chat = path.endswith("chat/completions")
    assert text_of(reply, chat=chat, stream=stream) == d.output_text()
    if stream:
        assert reply.sse()[-1] == "[DONE]"
    p_req, d_req = only_generation(p), only_generation(d)
    assert p_req.path == d_req.path == path
    # The prefill computes the KV and one token, never streams; the decode gets the client's
    # own request (its token budget and stream flag) plus the pairing.
    assert p_req.body["max_tokens"] == 1
    assert p_req.body["stream"] is False
    assert d_req.body["max_tokens"] == 7
    assert bool(d_req.body.get("stream")) is stream
    assert_paired(p, p_req, d_req)


@pytest.mark.parametrize("policy", ROUTER_POLICIES)
def test_each_prefill_is_paired_with_its_own_engine_id(
    engine: EngineFactory, start_router: RouterFactory, policy: str
) -> None:
    prefills = [engine("prefill", f"p{i}") for i in range(2)]
    decodes = [engine("decode", f"d{i}") for i in range(2)]
    assert prefills[0].engine_id != prefills[1].engine_id
    router = start_router(prefills, decodes, policy=policy)

    for i in range(8):
        assert post(router.base, "/v1/completions", completion_body(max_tokens=i + 2)).status == 200

    by_transfer = {}
    for p in prefills:
        for req in p.generation_requests():
            by_transfer[req.body["kv_transfer_params"]["transfer_id"]] = (p, req)
    decoded = [req for d in decodes for req in d.generation_requests()]
    assert len(decoded) == len(by_transfer) == 8
    for d_req in decoded:
        p, p_req = by_transfer[d_req.body["kv_transfer_params"]["transfer_id"]]
        assert_paired(p, p_req, d_req)
    # Each decode got its own client request (they differ only in max_tokens).
    assert sorted(req.body["max_tokens"] for req in decoded) == list(range(2, 10))
    if policy == "round_robin":
        assert all(len(e.generation_requests()) == 4 for e in (*prefills, *decodes))


def test_prefill_restart_leaves_the_router_with_a_stale_engine_id(
    engine: EngineFactory, start_router: RouterFactory
) -> None:
    """Why the operator restarts the router when a prefill engine restarts.

    vLLM mints a new engine_id at every engine start; the router asked `/query` once, at its own
    start, and keeps sending the old id, which the decoder can no longer find on that bootstrap
    server (its KV pull fails). A fresh router picks the new id up.
    """
    p = engine("prefill", "p0")
    d = engine("decode", "d0")
    router = start_router([p], [d])
    old_id = p.engine_id
    p.restart()
    assert p.engine_id != old_id
    router.wait_all_healthy()  # its 1 s health probe may have caught the restart

    assert post(router.base, "/v1/completions", completion_body()).status == 200
    stale = d.generation_requests()[-1].body["kv_transfer_params"]["remote_engine_id"]
    assert stale == old_id
    assert p.bootstrap_queries == 1

    router.stop()
    fresh = start_router([p], [d])
    assert post(fresh.base, "/v1/completions", completion_body()).status == 200
    assert d.generation_requests()[-1].body["kv_transfer_params"]["remote_engine_id"] == p.engine_id


# ---- failures: what the client sees (0.1.17 has no retries on the P/D path) -----------------


@pytest.fixture
def pair(engine: EngineFactory, start_router: RouterFactory) -> Pair:
    p = engine("prefill", "p0")
    d = engine("decode", "d0")
    return p, d, start_router([p], [d]).base


@pytest.mark.parametrize("status", [500, 503])
def test_prefill_error_fails_the_request_before_any_decode(pair: Pair, status: int) -> None:
    p, d, base = pair
    p.fail("status", status=status)
    reply = post(base, "/v1/completions", completion_body())
    assert reply.status == 500  # whatever the prefill's status was
    assert b"Prefill server" in reply.body and str(status).encode() in reply.body
    assert len(p.generation_requests()) == 1  # not retried
    assert d.generation_requests() == []  # no decode holds a slot for KV that never comes


def test_prefill_connection_drop_fails_the_request(
    pair: Pair,
) -> None:
    p, d, base = pair
    p.fail("drop")
    reply = post(base, "/v1/completions", completion_body())
    assert reply.status == 500
    assert len(p.generation_requests()) == 1
    assert d.generation_requests() == []


@pytest.mark.parametrize("status", [500, 503])
def test_decode_error_is_passed_through(pair: Pair, status: int) -> None:
    p, d, base = pair
    d.fail("status", status=status)
    reply = post(base, "/v1/completions", completion_body())
    assert reply.status == status
    assert reply.json()["message"] == "d0 failed"
    assert len(p.generation_requests()) == len(d.generation_requests()) == 1


def test_decode_connection_drop_fails_the_request(
    pair: Pair,
) -> None:
    _p, d, base = pair
    d.fail("drop")
    reply = post(base, "/v1/completions", completion_body())
    assert reply.status == 500
    assert b"Decode request failed" in reply.body
    assert len(d.generation_requests()) == 1


def test_decode_is_sent_only_after_the_prefill_answered(
    pair: Pair,
) -> None:
    p, d, base = pair
    p.fail("slow", delay=0.6)
    assert post(base, "/v1/completions", completion_body()).status == 200
    assert only_generation(d).at - only_generation(p).at >= 0.5


def test_router_recovers_after_failures(pair: Pair) -> None:
    p, _d, base = pair
    p.fail("status", times=1)
    assert post(base, "/v1/completions", completion_body()).status == 500
    assert post(base, "/v1/completions", completion_body()).status == 200


def test_liveness_and_metrics_endpoints(engine: EngineFactory, start_router: RouterFactory) -> None:
    router = start_router([engine("prefill", "p0")], [engine("decode", "d0")])
    assert get(router.base + ROUTER_LIVENESS_PATH)[0] == 200
    status, body = get(f"http://127.0.0.1:{router.metrics_port}/metrics")
    assert status == 200 and body  # served where --prometheus-port says


def test_router_is_not_ready_until_every_prefill_bootstrap_answers(
    engine: EngineFactory, start_router: RouterFactory
) -> None:
    p = engine("prefill", "p0", query_status=503)  # engine healthy, bootstrap not yet
    d = engine("decode", "d0")
    router = start_router([p], [d], wait_ready=False)
    deadline = time.monotonic() + 10
    while p.bootstrap_queries < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert p.bootstrap_queries >= 2  # retried
    try:
        status = get(router.base + ROUTER_READINESS_PATH, timeout=1)[0]
    except OSError:
        status = 0  # 0.1.17 does not even listen before every /query succeeded
    assert status != 200
    p.query_status = 200
    router.wait_ready(timeout=30)
    assert post(router.base, "/v1/completions", completion_body()).status == 200
    assert d.generation_requests()[-1].body["kv_transfer_params"]["remote_engine_id"] == p.engine_id

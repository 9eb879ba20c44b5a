"""A crashed engine under load, through the real vllm-router (issue 31, "crashes cost only what
was in flight").

One prefill, or one decode, of a 2P/2D set is killed (its listeners closed and the requests it
holds dropped at once, as a SIGKILL or a force-deleted pod) while a bounded loop of clients sends
completions, in turn, to routers over the same engines: one started with the operator's args
(`static_router_args`, which render `ROUTER_HEALTH_FLAGS`), a baseline without those flags
(0.1.17's defaults: what the operator rendered before), and the baseline with retries and a
circuit breaker that opens at the first failure. All see the same death, the same load and the
same noisy machine, so the test compares counts, not rates (router/failover.py; figures in
docs/benchmarks.md, "Router retries (issue 31)").

What 0.1.17 does in P/D mode (its source, `vllm_pd_router.rs`, and these tests): a request goes to
one prefill, then one decode, once. Nothing is retried, whatever `--retry-*` says, and nothing on
that path feeds the circuit breaker; but a worker is picked only while the health checker holds it
healthy. So what the operator can buy is how fast a dead engine leaves the pool, not a second
attempt: the requests sent to it meanwhile and the ones it held still fail. Nothing is duplicated.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from pdmtp.core.render.router import ROUTER_READINESS_PATH
from router.emulator import EngineEmulator, EngineFactory, Role
from router.failover import RETRY_AND_BREAKER, load_loop
from router.harness import RouterFactory, completion_body, get, post

SKIPPED_WITHIN_S = 2.5
"""A dead engine refuses at once, so the next 1 s probe drops it; the bound leaves the noisy
machine 1.5 s of slack. Every request sent later must succeed."""


def transfer_ids(emu: EngineEmulator) -> list[str]:
    """The transfer ids of the generation requests `emu` received."""
    return [str(r.body["kv_transfer_params"]["transfer_id"]) for r in emu.generation_requests()]


@pytest.mark.parametrize("victim_role", ["prefill", "decode"])
def test_a_killed_engine_leaves_the_pool_within_a_probe_and_nothing_is_sent_twice(
    engine: EngineFactory, start_router: RouterFactory, victim_role: Role
) -> None:
    # Decodes pull their KV from the prefill named in the request, as vLLM's Mooncake decoder
    # does: a request whose prefill died before the pull fails on the decode ("KV load failed").
    prefills = [engine("prefill", f"p{i}", shutdown_timeout=0.0) for i in range(2)]
    decodes = [engine("decode", f"d{i}", shutdown_timeout=0.0, pull_kv=True) for i in range(2)]
    rendered = start_router(prefills, decodes)
    baseline = start_router(prefills, decodes, health_checks=False)
    retrying = start_router(prefills, decodes, health_checks=False, extra_args=RETRY_AND_BREAKER)
    victim = prefills[0] if victim_role == "prefill" else decodes[0]

    bases = {"rendered": rendered.base, "baseline": baseline.base, "retrying": retrying.base}
    run = load_loop(bases, victim.stop)

    got, base, retried = (run.summary(name) for name in ("rendered", "baseline", "retrying"))
    print(f"\nkilled one {victim_role} of 2P/2D: {got=} {base=} {retried=}")
    # The baseline keeps sending half of its requests to the dead engine for as long as it runs
    # (60 or more after the kill); retries and a circuit breaker opening at the first failure
    # change nothing in P/D mode.
    assert base["failed"] >= 25, base
    assert retried["failed"] * 3 >= base["failed"] * 2, (retried, base)
    assert got["failed"] * 3 <= base["failed"], (got, base)
    # 0 once the dead engine is skipped, over a good number of requests.
    late = [o for o in run.of("rendered") if o.sent > run.killed_at + SKIPPED_WITHIN_S]
    assert len(late) >= 20, got
    assert [o for o in late if o.status != 200] == []
    for o in run.failed("rendered"):
        assert b"Transparent proxy request failed" in o.body or b"KV load failed" in o.body, o
    # The router stays Ready with one engine of each role left (its readiness counts healthy ones).
    status, body = get(rendered.base + ROUTER_READINESS_PATH)
    assert status == 200, body
    assert json.loads(body)[victim_role] == {"healthy": 1, "total": 2}

    # Nothing sent twice: every transfer reached at most one prefill and at most one decode,
    # and every decode was paired with the prefill that computed its transfer.
    prefilled = {t: p for p in prefills for t in transfer_ids(p)}
    assert sum(len(transfer_ids(p)) for p in prefills) == len(prefilled)
    decoded = [r for d in decodes for r in d.generation_requests()]
    counts = Counter(r.body["kv_transfer_params"]["transfer_id"] for r in decoded)
    assert counts and max(counts.values()) == 1
    for r in decoded:
        params = r.body["kv_transfer_params"]
        p = prefilled[params["transfer_id"]]
        assert (params["remote_engine_id"], params["remote_bootstrap_addr"]) == (
            p.engine_id,
            p.bootstrap_addr,
        )
    if victim_role == "prefill":
        # The dead prefill's KV handle is never handed to a decode once it is gone.
        stale = [
            r
            for r in decoded
            if r.at > run.killed_at + 1.0
            and r.body["kv_transfer_params"]["remote_bootstrap_addr"] == victim.bootstrap_addr
        ]
        assert stale == []


# ---- the retry and circuit-breaker flags do nothing in P/D mode -------------------------------


FAULTS = ("prefill 503", "prefill refused", "decode 503", "decode refused")


@pytest.mark.parametrize("fault", FAULTS)
def test_pd_mode_never_retries_even_when_told_to(
    engine: EngineFactory, start_router: RouterFactory, fault: str
) -> None:
    """With retries and a one-failure circuit breaker configured (and health probes left at the
    60 s default, so only those could act), each request still reaches one prefill and one
    decode at most: a fault on one engine of a 2P/2D set fails every request paired with it,
    and the healthy engine of that role gets exactly its round-robin share, never a retry."""
    prefills = [engine("prefill", f"p{i}", shutdown_timeout=0.0) for i in range(2)]
    decodes = [engine("decode", f"d{i}", shutdown_timeout=0.0) for i in range(2)]
    router = start_router(prefills, decodes, health_checks=False, extra_args=RETRY_AND_BREAKER)
    role, how = fault.split()
    bad, good = prefills if role == "prefill" else decodes
    if how == "503":
        bad.fail("status", status=503)
    else:
        bad.stop()

    statuses = [post(router.base, "/v1/completions", completion_body()).status for _ in range(8)]

    assert statuses.count(200) == 4, statuses
    assert len(good.generation_requests()) == 4
    if how == "503":
        assert len(bad.generation_requests()) == 4  # its share, each request once
    # A decode gets a request only after its prefill answered, and once.
    decoded = sum(len(d.generation_requests()) for d in decodes)
    assert decoded == {"prefill 503": 4, "prefill refused": 4, "decode 503": 8}.get(fault, 4)


# ---- a decode that dies after it started streaming ---------------------------------------------


@dataclass
class StallingDecode(EngineEmulator):
    """Streams its first token, then holds the response open until `cut` is set, when it drops
    the connection with no end to the stream (as a killed process's socket)."""

    streamed: threading.Event = field(default_factory=threading.Event)
    cut: threading.Event = field(default_factory=threading.Event)

    async def _stream(self, request: web.Request, chat: bool, text: str) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunk = {"id": self.name, "object": "text_completion", "choices": [{"text": "first "}]}
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.streamed.set()
        deadline = time.monotonic() + 30
        while not self.cut.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert request.transport is not None
        request.transport.abort()
        raise asyncio.CancelledError


def probed_since(engine: EngineEmulator, since: float) -> bool:
    """Whether the router has health-checked `engine` after `since` (time.monotonic())."""
    return any(r.path == "/health" and r.at > since for r in list(engine.requests))


def read_stream(base: str, result: dict[str, Any], first: threading.Event) -> None:
    """POST a streaming completion; record each `data:` line as it comes and how it ended."""
    req = urllib.request.Request(
        base + "/v1/completions",
        data=json.dumps(completion_body(stream=True)).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    events: list[str] = result.setdefault("events", [])
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            result["status"] = r.status
            for line in r:
                if line.startswith(b"data: "):
                    events.append(line[6:].decode().strip())
                    first.set()
        result["ended"] = "eof"
    except Exception as e:  # how the stream ended is the observation
        result["ended"] = repr(e)
    first.set()


def test_a_decode_that_dies_mid_stream_is_not_retried(
    engine: EngineFactory, start_router: RouterFactory
) -> None:
    prefills = [engine("prefill", f"p{i}", shutdown_timeout=0.0) for i in range(2)]
    decodes: Sequence[StallingDecode] = [
        StallingDecode("decode", f"d{i}", shutdown_timeout=0.0).start() for i in range(2)
    ]
    try:
        router = start_router(prefills, decodes)
        result: dict[str, Any] = {}
        first = threading.Event()
        client = threading.Thread(target=read_stream, args=(router.base, result, first))
        client.start()
        assert first.wait(timeout=10), result
        assert result["status"] == 200 and len(result["events"]) == 1, result
        serving = [d for d in decodes if d.streamed.is_set()]
        assert len(serving) == 1
        cut_at = time.monotonic()
        serving[0].cut.set()  # it dies after its first token reached the client
        serving[0].stop()
        client.join(timeout=15)
        assert not client.is_alive()
        # Every engine left health-probed since the cut (every 1 s): by then a retry, if the
        # router made one (its backoff is milliseconds), has reached an engine.
        left = [*prefills, *(d for d in decodes if d is not serving[0])]
        deadline = time.monotonic() + 15
        while not all(probed_since(e, cut_at) for e in left):
            assert time.monotonic() < deadline, "no health probe of the engines left"
            time.sleep(0.05)

        print(f"\nstream cut after its first token: the client saw {result}")
        # The client saw one token and a cut stream, never a second answer.
        assert result["events"] == [result["events"][0]] and "[DONE]" not in result["events"]
        assert json.loads(result["events"][0])["choices"][0]["text"] == "first "
        assert sum(len(p.generation_requests()) for p in prefills) == 1
        assert sum(len(d.generation_requests()) for d in decodes) == 1
        # And the pool goes on serving with the decode that is left.
        assert post(router.base, "/v1/completions", completion_body()).status == 200
    finally:
        for d in decodes:
            d.stop()

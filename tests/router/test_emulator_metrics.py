"""The emulator's vLLM scaling metrics follow the load it really carries (issue 22).

An autoscaler is proven on kind against emulated engines, so their `/metrics` must move the way
a real engine's do: requests beyond the capacity wait, the histograms count what really happened,
MTP acceptance follows the configured rate (and a change to it at runtime), and a lower acceptance
makes decode hold more requests at the same offered load. Every check reads the metrics through
the operator's own parser (`pdmtp.core.promtext.parse_scrape`), and one feeds them to
`pdmtp.core.scaling.autoscaler.evaluate`, so a rename on either side fails here.

Everything binds 127.0.0.1; every load is a fixed number of requests with a time bound.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
import pytest
from pdmtp.api.autoscaling import AutoscalingSpec, RoleAutoscaling
from pdmtp.api.vocabulary import ENGINE_ROLES, EngineRole
from pdmtp.core.promtext import Scrape, parse_scrape
from pdmtp.core.scaling.autoscaler import Coverage, PodObservation, RoleHistory, Signal, evaluate
from router.emulator import EngineEmulator, EngineFactory, Identity, Tuning
from router.harness import RouterFactory, completion_body, get, post

LOAD_BOUND_SECONDS = 30.0
"""No load in this file runs longer (the tier's per-test timeout is 120 s)."""
NO_HISTORY: dict[EngineRole, RoleHistory] = {"prefill": RoleHistory(), "decode": RoleHistory()}


def default_autoscaling(expected_acceptance_length: float) -> AutoscalingSpec:
    """Both roles on their default signals, the decode told its MTP acceptance."""
    return AutoscalingSpec(
        prefill=RoleAutoscaling(min_replicas=1, max_replicas=8),
        decode=RoleAutoscaling(
            min_replicas=1, max_replicas=8, expected_acceptance_length=expected_acceptance_length
        ),
    )


# ---- helpers ---------------------------------------------------------------------------------


def metrics_text(url: str) -> str:
    status, body = get(f"{url}/metrics")
    assert status == 200, body
    return body.decode()


def scrape(url: str) -> Scrape:
    return parse_scrape(metrics_text(url), time.monotonic())


def series(text: str, name: str) -> dict[str, float]:
    """Every sample of exactly `name`, keyed by its raw label set (for what promtext folds)."""
    pattern = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$")
    found = {}
    for line in text.splitlines():
        match = pattern.match(line)
        if match:
            found[match.group(1) or ""] = float(match.group(2))
    return found


def single(text: str, name: str) -> float:
    values = series(text, name)
    assert len(values) == 1, (name, values)
    return next(iter(values.values()))


def buckets(text: str, histogram: str) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) per bucket of `histogram`, in the order served."""
    out = []
    for labels, value in series(text, f"{histogram}_bucket").items():
        le = re.search(r'le="([^"]+)"', labels)
        assert le is not None, labels
        out.append((math.inf if le.group(1) == "+Inf" else float(le.group(1)), value))
    return out


def configure(emu: EngineEmulator, **changes: Any) -> tuple[int, Any]:
    """The admin endpoint, over HTTP as a test on kind would call it."""
    reply = post(emu.url, "/emulator/config", changes)
    return reply.status, reply.json()


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@dataclass
class LoadResult:
    statuses: list[int]
    samples: dict[str, list[Scrape]] = field(default_factory=dict)
    """Per engine URL, the scrapes taken every `sample_every` while the load ran."""

    def occupancy(self, url: str) -> float:
        """Mean running + waiting over the samples."""
        values = [(s.running or 0.0) + (s.waiting or 0.0) for s in self.samples[url]]
        return sum(values) / len(values)

    def peak(self, url: str, attribute: str) -> float:
        return max(float(getattr(s, attribute) or 0.0) for s in self.samples[url])


def offered_load(
    targets: Sequence[str],
    requests: int,
    *,
    every: float,
    max_tokens: int,
    sample_every: float = 0.02,
) -> LoadResult:
    """Send `requests` completions to each target, one started every `every` seconds (0: all at
    once; the same schedule for every target), and scrape each target's /metrics meanwhile."""

    async def run() -> LoadResult:
        result = LoadResult([], {url: [] for url in targets})
        done = asyncio.Event()
        timeout = aiohttp.ClientTimeout(total=LOAD_BOUND_SECONDS)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

            async def one(url: str) -> None:
                body = completion_body(max_tokens=max_tokens)
                async with session.post(f"{url}/v1/completions", json=body) as resp:
                    await resp.read()
                    result.statuses.append(resp.status)

            async def sample() -> None:
                while not done.is_set():
                    for url in targets:
                        async with session.get(f"{url}/metrics") as resp:
                            text = await resp.text()
                        result.samples[url].append(parse_scrape(text, time.monotonic()))
                    await asyncio.sleep(sample_every)

            sampler = asyncio.create_task(sample())
            sends: list[asyncio.Task[None]] = []
            for _ in range(requests):
                sends.extend(asyncio.create_task(one(url)) for url in targets)
                if every:
                    await asyncio.sleep(every)
            await asyncio.gather(*sends)
            done.set()
            await sampler
        return result

    return asyncio.run(asyncio.wait_for(run(), LOAD_BOUND_SECONDS))


# ---- the tests ---------------------------------------------------------------------------------


def test_requests_beyond_the_capacity_wait_and_the_gauges_drain(engine: EngineFactory) -> None:
    tuning = Tuning(max_running=2, step_seconds=0.02, prefill_seconds=0.01, batch_slowdown=0.0)
    emu = engine("decode", "d0", tuning=tuning)
    idle = scrape(emu.url)
    assert (idle.running, idle.waiting, idle.kv_cache_usage) == (0.0, 0.0, 0.0)

    # 8 at once on 2 slots: 4 waves of 0.01 s prefill + 4 steps of 0.02 s.
    load = offered_load([emu.url], 8, every=0, max_tokens=5, sample_every=0.01)
    assert load.statuses == [200] * 8
    assert load.peak(emu.url, "running") == 2  # never more than the capacity
    assert load.peak(emu.url, "waiting") >= 4
    assert load.peak(emu.url, "kv_cache_usage") == 1.0

    after = scrape(emu.url)
    assert (after.running, after.waiting, after.kv_cache_usage) == (0.0, 0.0, 0.0)
    assert after.queue_time is not None and after.time_to_first_token is not None
    assert after.inter_token_latency is not None
    assert after.queue_time.count == after.time_to_first_token.count == 8
    # Requests 3..8 waited at least one whole request (0.09 s) each; waves 2..4 of two.
    assert after.queue_time.sum >= 2 * (1 + 2 + 3) * 0.09 * 0.9
    # TTFT holds the queue time and the prefill of each request.
    assert after.time_to_first_token.sum >= after.queue_time.sum + 8 * 0.01
    # Without MTP every step after the first token emits one token: 4 gaps per request.
    assert after.inter_token_latency.count == 8 * 4
    assert 0.02 <= after.inter_token_latency.sum / 32 < 0.1
    assert after.drafts is None and after.accepted_tokens is None  # no speculative config


def test_histograms_count_every_completed_request_and_step(engine: EngineFactory) -> None:
    emu = engine(
        "decode",
        "d0",
        identity=Identity("d0", "r1", speculative_tokens=3),
        tuning=Tuning(max_running=4, acceptance_rate=0.5, step_seconds=0.005),
    )
    load = offered_load([emu.url], 12, every=0, max_tokens=10)
    assert load.statuses == [200] * 12

    text = metrics_text(emu.url)
    parsed = parse_scrape(text, time.monotonic())
    assert parsed.time_to_first_token is not None and parsed.queue_time is not None
    assert parsed.inter_token_latency is not None and parsed.drafts is not None
    assert parsed.time_to_first_token.count == parsed.queue_time.count == 12
    assert single(text, "vllm:request_success_total") == 12
    assert single(text, "vllm:generation_tokens_total") == 12 * 10
    # Every step after the first token verifies one draft and is one inter-token gap.
    assert parsed.inter_token_latency.count == parsed.drafts > 0
    assert single(text, "vllm:spec_decode_num_draft_tokens_total") == 3 * parsed.drafts
    for name in (
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:request_queue_time_seconds",
    ):
        cumulative = buckets(text, name)
        bounds = [bound for bound, _ in cumulative]
        assert bounds == sorted(bounds) and bounds[-1] == math.inf, name
        counts = [count for _, count in cumulative]
        assert counts == sorted(counts), name  # cumulative
        assert counts[-1] == single(text, f"{name}_count"), name


def test_acceptance_follows_the_configured_rate_and_the_admin_call(engine: EngineFactory) -> None:
    k = 3
    emu = engine(
        "decode",
        "d0",
        identity=Identity("d0", "r1", speculative_tokens=k),
        tuning=Tuning(acceptance_rate=0.8, step_seconds=0.002),
    )
    assert offered_load([emu.url], 16, every=0, max_tokens=40).statuses == [200] * 16
    text = metrics_text(emu.url)
    first = parse_scrape(text, time.monotonic())
    assert first.accepted_tokens is not None and first.drafts is not None
    draft_tokens = single(text, "vllm:spec_decode_num_draft_tokens_total")
    assert first.accepted_tokens / draft_tokens == pytest.approx(0.8, abs=0.02)
    assert first.accepted_tokens / first.drafts == pytest.approx(0.8 * k, abs=0.06)

    status, body = configure(emu, acceptance_rate=0.3)
    assert status == 200, body
    assert body["acceptance_rate"] == 0.3
    assert json.loads(get(f"{emu.url}/emulator/config")[1])["acceptance_rate"] == 0.3

    assert offered_load([emu.url], 16, every=0, max_tokens=40).statuses == [200] * 16
    text = metrics_text(emu.url)
    second = parse_scrape(text, time.monotonic())
    assert second.accepted_tokens is not None and second.drafts is not None
    accepted = second.accepted_tokens - first.accepted_tokens
    drafts = second.drafts - first.drafts
    assert accepted / (drafts * k) == pytest.approx(0.3, abs=0.02)
    # The same window as the autoscaler reads it: accepted tokens per draft, between two scrapes.
    decision = evaluate(
        default_autoscaling(expected_acceptance_length=2.4),
        {"prefill": [], "decode": [PodObservation("d0", True, latest=second, previous=first)]},
        {"prefill": 1, "decode": 1},
        NO_HISTORY,
        now=time.monotonic(),
    )
    acceptance = decision.roles["decode"].acceptance
    assert acceptance is not None and acceptance.observed is not None
    assert acceptance.observed == pytest.approx(0.3 * k, abs=0.06)


def test_a_lower_acceptance_holds_more_requests_at_the_same_offered_load(
    engine: EngineFactory,
) -> None:
    tuning = Tuning(max_running=8, acceptance_rate=0.9, step_seconds=0.01)
    high = engine("decode", "high", identity=Identity("high", "r1", 3), tuning=tuning)
    low = engine("decode", "low", identity=Identity("low", "r1", 3), tuning=tuning)
    # The same pod, told at runtime: nothing restarts.
    assert configure(low, acceptance_rate=0.1)[0] == 200

    # 40 requests a second to each for 1 s. At 0.9 a request takes ~8 steps (3.7 tokens a step),
    # ~3-4 run at once; at 0.1 it takes ~19 steps, more than the 8 slots hold at this rate.
    load = offered_load([high.url, low.url], 40, every=0.025, max_tokens=24)
    assert load.statuses == [200] * 80
    assert load.occupancy(low.url) >= 1.5 * load.occupancy(high.url)
    assert load.peak(low.url, "waiting") > 0
    assert load.peak(low.url, "running") == 8
    # Same requests, same tokens out: the difference is steps per token, not demand.
    for emu in (high, low):
        assert single(metrics_text(emu.url), "vllm:generation_tokens_total") == 40 * 24


def test_the_capacity_changes_at_runtime_and_bad_settings_are_refused(
    engine: EngineFactory,
) -> None:
    emu = engine("decode", "d0", tuning=Tuning(max_running=1, step_seconds=0.02))
    before = json.loads(get(f"{emu.url}/emulator/config")[1])
    for bad in (
        {"acceptance_rate": 1.5},
        {"acceptance_rate": -0.1},
        {"max_running": 0},
        {"max_running": 2.5},
        {"step_seconds": True},
        {"step_seconds": "fast"},
        {"no_such_knob": 1},
        {"acceptance_rate": 0.5, "max_running": 0},  # all or nothing
        [1, 2],
    ):
        reply = post(emu.url, "/emulator/config", bad)  # type: ignore[arg-type]
        assert reply.status == 400, (bad, reply.body)
        assert "error" in reply.json()
    assert json.loads(get(f"{emu.url}/emulator/config")[1]) == before

    async def four_at_once() -> list[int]:
        timeout = aiohttp.ClientTimeout(total=LOAD_BOUND_SECONDS)
        async with aiohttp.ClientSession(timeout=timeout) as session:

            async def one() -> int:
                body = completion_body(max_tokens=25)  # ~0.5 s each
                async with session.post(f"{emu.url}/v1/completions", json=body) as resp:
                    await resp.read()
                    return resp.status

            tasks = [asyncio.create_task(one()) for _ in range(4)]
            await asyncio.to_thread(
                wait_until, lambda: emu.waiting == 3, 5, "three requests waiting"
            )
            now = scrape(emu.url)
            assert (now.running, now.waiting) == (1.0, 3.0)
            status, body = configure(emu, max_running=4)  # the waiters start at once
            assert status == 200, body
            now = scrape(emu.url)
            assert (now.running, now.waiting) == (4.0, 0.0)
            return list(await asyncio.gather(*tasks))

    statuses = asyncio.run(asyncio.wait_for(four_at_once(), LOAD_BOUND_SECONDS))
    assert statuses == [200] * 4
    assert emu.tuning.max_running == 4


def test_the_metrics_only_port_serves_the_same_series(engine: EngineFactory) -> None:
    emu = engine("prefill", "p0", identity=Identity("p0", "r1", 3), metrics_port=0, tuning=Tuning())
    assert emu.metrics_port
    relay = f"http://127.0.0.1:{emu.metrics_port}"
    assert offered_load([emu.url], 5, every=0, max_tokens=1).statuses == [200] * 5
    on_api, on_relay = scrape(emu.url), scrape(relay)
    assert replace(on_relay, at=0) == replace(on_api, at=0)
    assert on_relay.time_to_first_token is not None
    assert on_relay.time_to_first_token.count == 5
    # A prefill asked for one token never decodes: its MTP drafter verifies nothing.
    assert (on_relay.drafts, on_relay.accepted_tokens) == (0.0, 0.0)
    # Metrics only: no admin endpoint and no generation there.
    assert get(f"{relay}/emulator/config")[0] == 404
    assert post(relay, "/emulator/config", {"acceptance_rate": 0.1}).status in (404, 405)
    assert post(relay, "/v1/completions", completion_body()).status in (404, 405)


def test_the_pods_env_sets_the_knobs_and_its_speculative_config_sets_k() -> None:
    # Imported here: the router tier's emulator module puts the package on the path.
    from pdmtp_emulator.serve import engine_from

    argv = [
        "vllm",
        "serve",
        "org/model",
        "--speculative-config",
        json.dumps({"method": "mtp", "num_speculative_tokens": 2}),
        "--kv-transfer-config",
        json.dumps({"kv_role": "kv_consumer"}),
    ]
    env = {
        "PDMTP_ROLE": "decode",
        "PDMTP_EMULATOR_MAX_RUNNING": "3",
        "PDMTP_EMULATOR_ACCEPTANCE_RATE": "0.25",
        "PDMTP_EMULATOR_STEP_SECONDS": "0.04",
    }
    emu = engine_from(argv, env, "demo-abc123-decode-7d9f-x1")
    assert emu.tuning == Tuning(max_running=3, acceptance_rate=0.25, step_seconds=0.04)
    assert emu.scheduler.k == 2
    assert engine_from(argv, {"PDMTP_ROLE": "decode"}, "p").tuning == Tuning()
    for bad in ({"PDMTP_EMULATOR_MAX_RUNNING": "0"}, {"PDMTP_EMULATOR_ACCEPTANCE_RATE": "x"}):
        with pytest.raises(SystemExit, match="emulator settings"):
            engine_from(argv, {"PDMTP_ROLE": "decode", **bad}, "p")


def test_prefill_and_decode_metrics_through_the_router_feed_every_default_signal(
    engine: EngineFactory, start_router: RouterFactory
) -> None:
    k, rate = 3, 0.6
    tuning = Tuning(acceptance_rate=rate)
    p = engine("prefill", "p0", identity=Identity("p0", "r1", k), tuning=tuning)
    d = engine("decode", "d0", identity=Identity("d0", "r1", k), tuning=tuning, pull_kv=True)
    router = start_router([p], [d])
    before = {emu.name: scrape(emu.url) for emu in (p, d)}
    for _ in range(6):
        reply = post(router.base, "/v1/completions", completion_body(max_tokens=9))
        assert reply.status == 200, reply.body
    after = {emu.name: scrape(emu.url) for emu in (p, d)}

    for name in ("p0", "d0"):
        ttft = after[name].time_to_first_token
        assert ttft is not None and ttft.count == 6, name
    assert after["p0"].drafts == 0  # the router asks a prefill for one token
    decode_text = metrics_text(d.url)
    assert single(decode_text, "vllm:generation_tokens_total") == 6 * 9
    assert after["d0"].inter_token_latency is not None
    assert after["d0"].inter_token_latency.count == after["d0"].drafts

    spec = default_autoscaling(expected_acceptance_length=rate * k)
    decision = evaluate(
        spec,
        {
            "prefill": [PodObservation("p0", True, latest=after["p0"], previous=before["p0"])],
            "decode": [PodObservation("d0", True, latest=after["d0"], previous=before["d0"])],
        },
        {"prefill": 1, "decode": 1},
        NO_HISTORY,
        now=time.monotonic(),
    )
    for role in ENGINE_ROLES:
        scaling = spec.role(role)
        assert scaling is not None
        readings = decision.roles[role].readings
        assert {r.signal for r in readings} == set(scaling.signal_targets(role)), role
        assert all(r.coverage is Coverage.FULL for r in readings), decision.roles[role].reason
    decode_signals = {r.signal for r in decision.roles["decode"].readings}
    assert Signal.DECODE_TOKENS_PER_POD in decode_signals
    acceptance = decision.roles["decode"].acceptance
    assert acceptance is not None and acceptance.observed == pytest.approx(rate * k, abs=0.2)

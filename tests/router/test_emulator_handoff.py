"""The emulated decode's hand-off counts and faults, through the real vllm-router, judged by the
operator's own reader and verdict (`pdmtp.core.promtext`, `pdmtp.core.verification.verdict`, issue
41).

The kind e2e proves the rollout gate against emulated pairs; here each fault the emulator can be
told to have (a pull that fails, a decode-only fallback, an engine without the fixed connector,
a lower MTP acceptance, a prefill restarted under its decode) is shown to reach the verdict it
must, and a healthy pair to be Verified. Everything binds 127.0.0.1; each load is 10 requests.
"""

from __future__ import annotations

import time
from dataclasses import replace

from pdmtp.core.promtext import parse_scrape
from pdmtp.core.scaling.roles import PodMetrics
from pdmtp.core.verification.verdict import Finding, Rules, judge, lifetime, recent
from pdmtp_emulator.handoff import HandoffCounts
from router.emulator import EngineEmulator, EngineFactory, Identity, Tuning
from router.harness import RouterFactory, completion_body, get, post

K = 3
RULES = Rules(expected_backoff=K - 1, min_requests=8, min_drafts=20)
REQUESTS = 10


def pair(
    engine: EngineFactory, start_router: RouterFactory, name: str, tuning: Tuning | None = None
) -> tuple[EngineEmulator, str]:
    tuning = tuning or Tuning()
    p = engine("prefill", f"{name}-p", identity=Identity(f"{name}-p", name, K), tuning=tuning)
    d = engine(
        "decode", f"{name}-d", identity=Identity(f"{name}-d", name, K), tuning=tuning, pull_kv=True
    )
    return d, start_router([p], [d]).base


def load(router: str, requests: int = REQUESTS) -> list[int]:
    statuses = []
    for i in range(requests):
        body = {**completion_body(max_tokens=12), "prompt": f"request {i} of the hand-off test"}
        statuses.append(post(router, "/v1/completions", body).status)
    return statuses


def scraped(decode: EngineEmulator, previous: PodMetrics | None = None) -> PodMetrics:
    status, body = get(f"{decode.url}/metrics")
    assert status == 200, body
    latest = parse_scrape(body.decode(), time.monotonic())
    return PodMetrics(latest, None if previous is None else previous.latest)


def test_a_healthy_pair_is_verified(engine: EngineFactory, start_router: RouterFactory) -> None:
    decode, router = pair(engine, start_router, "ok")
    assert load(router) == [200] * REQUESTS
    handoff = lifetime([scraped(decode)])
    # "request {i} of the hand-off test": 6 words, of which the decode recomputes the backoff
    # (2) and the drafter refresh (3) the fixed connector adds, and pulls 1
    assert (handoff.requests, handoff.pulled_tokens, handoff.backoff_tokens) == (10, 10, 20)
    assert handoff.failed == handoff.decode_only == 0 and handoff.drafts > RULES.min_drafts
    assert judge(handoff, None, RULES).finding == Finding.VERIFIED


def test_each_fault_reaches_its_verdict_while_every_request_succeeds(
    engine: EngineFactory, start_router: RouterFactory
) -> None:
    """One serving pair, told each fault in turn while it serves; each judged over the window
    of its own load (`recent`), against the healthy window before it."""
    decode, router = pair(engine, start_router, "faults", Tuning(acceptance_rate=0.7))
    healthy = Tuning(acceptance_rate=0.7)
    assert load(router) == [200] * REQUESTS
    before = scraped(decode)
    reference = lifetime([before])
    faults = [
        # half the pulls fail and are recomputed
        ({"pull_failure_rate": 0.5}, Finding.PULL_FAILED, {"failed": 5, "requests": 5}),
        ({"decode_only_rate": 1.0}, Finding.DECODE_ONLY, {"decode_only": 10, "requests": 0}),
        ({"acceptance_rate": 0.3}, Finding.ACCEPTANCE_REGRESSED, {"requests": 10, "failed": 0}),
        ({}, Finding.VERIFIED, {"requests": 10, "failed": 0, "decode_only": 0}),
        # last: a real engine changes connector only by restarting, counters from zero
        ({"fixed_connector": 0}, Finding.NOT_REPORTED, {"requests": 0}),
    ]
    for changes, finding, counted in faults:
        decode.configure(**{**healthy.as_dict(), **changes})
        assert load(router) == [200] * REQUESTS, changes  # request counts see none of these
        after = scraped(decode, before)
        before = after
        window = recent([after])
        if changes.get("fixed_connector") == 0:
            # no hand-off series at all: the engine image without the fix
            assert after.latest is not None and after.latest.kv_pulled_requests is None
        assert {key: getattr(window, key) for key in counted} == counted, changes
        assert judge(window, reference, RULES).finding == finding, changes
    assert reference.drafts >= RULES.min_drafts and reference.acceptance is not None


def test_a_prefill_restarted_under_its_decode_fails_pulls(
    engine: EngineFactory, start_router: RouterFactory
) -> None:
    p = engine("prefill", "p", identity=Identity("p", "r1", K))
    d = engine("decode", "d", identity=Identity("d", "r1", K), pull_kv=True)
    router = start_router([p], [d])
    assert load(router.base, 2) == [200, 200]
    p.restart()  # new engine id; the router keeps sending the old one (docs/router.md)
    router.wait_all_healthy()
    assert load(router.base, 1) == [500]
    handoff = lifetime([scraped(d)])
    assert (handoff.requests, handoff.failed) == (2, 1)
    assert judge(handoff, None, replace(RULES, min_requests=1)).finding == Finding.PULL_FAILED


def test_a_serving_pair_that_starts_failing_shows_in_the_recent_window(
    engine: EngineFactory, start_router: RouterFactory
) -> None:
    decode, router = pair(engine, start_router, "serving")
    assert load(router) == [200] * REQUESTS
    first = scraped(decode)
    decode.configure(pull_failure_rate=1.0)
    assert load(router, 4) == [200] * 4
    window = recent([scraped(decode, first)])
    assert (window.requests, window.failed) == (0, 4)
    assert judge(window, None, replace(RULES, min_requests=0)).finding == Finding.PULL_FAILED
    # over its whole life it pulled 10 and failed 4: still failed, with the history behind it
    assert lifetime([scraped(decode)]).requests == REQUESTS


def test_the_emulated_decode_backs_off_what_its_engine_derived() -> None:
    """Given the operator's expected backoff (as a real engine's launcher enforces it), the
    emulated decode recomputes that; single-module MTP with k = 2 derives a lookahead of 1, no
    backoff, where k - 1 would be 1."""
    tuning = Tuning()
    assert HandoffCounts(2).backoff(tuning) == 1
    assert HandoffCounts(2, derived_backoff=0).backoff(tuning) == 0
    assert HandoffCounts(None, derived_backoff=2).backoff(tuning) == 0
    assert HandoffCounts(3, derived_backoff=2).backoff(replace(tuning, fixed_connector=0)) == 0

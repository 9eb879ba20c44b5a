"""The emulated decode's hand-off counts and faults, through the real vllm-router, judged by the
operator's own reader and verdict (`pdmtp.core.promtext`, `core.windows`,
`pdmtp.core.verification.verdict`, issues 41 and 50).

The kind e2e proves the rollout gate against emulated pairs; here each fault the emulator can be
told to have (a pull that fails, under either kv_load_failure_policy, a decode-only fallback, an
engine without the fixed connector, a lower MTP acceptance, a prefill restarted under its decode)
is shown to reach the verdict it must, and a healthy pair to be Verified; and request classes,
which the load client names in the prompt, to accept their own share of drafts. Everything binds
127.0.0.1; each load is 10 requests, scraped as the operator does into windows.
"""

from __future__ import annotations

import time
from dataclasses import replace

from pdmtp.core.promtext import parse_scrape
from pdmtp.core.verification.verdict import (
    Finding,
    Reference,
    Rules,
    evidence,
    judge,
    recent,
)
from pdmtp.core.windows import PodMetrics
from pdmtp_emulator.handoff import HandoffCounts
from pdmtp_emulator.load import parse_weights
from router.emulator import EngineEmulator, EngineFactory, Identity, Tuning
from router.harness import RouterFactory, completion_body, get, post

K = 3
RULES = Rules(expected_backoff=K - 1, min_requests=8, min_drafts=20)
REQUESTS = 10


def pair(
    engine: EngineFactory,
    start_router: RouterFactory,
    name: str,
    tuning: Tuning | None = None,
    policy: str = "fail",
) -> tuple[EngineEmulator, str]:
    tuning = tuning or Tuning()
    p = engine("prefill", f"{name}-p", identity=Identity(f"{name}-p", name, K), tuning=tuning)
    d = engine(
        "decode",
        f"{name}-d",
        identity=Identity(f"{name}-d", name, K),
        tuning=tuning,
        pull_kv=True,
        load_failure_policy=policy,
    )
    return d, start_router([p], [d]).base


def load(router: str, requests: int = REQUESTS, prefix: str = "") -> list[int]:
    statuses = []
    for i in range(requests):
        prompt = f"{prefix}request {i} of the hand-off test"
        body = {**completion_body(max_tokens=12), "prompt": prompt}
        statuses.append(post(router, "/v1/completions", body).status)
    return statuses


def scraped(decode: EngineEmulator, held: PodMetrics | None = None) -> PodMetrics:
    """The decode's metrics scraped now into what the operator holds (`held` before)."""
    status, body = get(f"{decode.url}/metrics")
    assert status == 200, body
    return (held or PodMetrics()).scraped(parse_scrape(body.decode(), time.monotonic()))


def test_a_healthy_pair_is_verified(engine: EngineFactory, start_router: RouterFactory) -> None:
    decode, router = pair(engine, start_router, "ok")
    assert load(router) == [200] * REQUESTS
    handoff = evidence([scraped(decode)])
    # "request {i} of the hand-off test": 6 words, of which the decode recomputes the backoff
    # (2) and the drafter refresh (3) the fixed connector adds, and pulls 1
    assert (handoff.requests, handoff.pulled_tokens, handoff.backoff_tokens) == (10, 10, 20)
    assert handoff.failed == handoff.decode_only == 0 and handoff.drafts > RULES.min_drafts
    assert judge(handoff, None, RULES).finding == Finding.VERIFIED


def test_each_fault_reaches_its_verdict(engine: EngineFactory, start_router: RouterFactory) -> None:
    """One serving pair, told each fault in turn while it serves; each judged over the windows
    of its own load (8 loads of 10, a scrape after each), against the healthy windows before.
    Under kv_load_failure_policy recompute every request is answered; the fault shows in the
    counters alone."""
    decode, router = pair(engine, start_router, "faults", Tuning(acceptance_rate=0.7), "recompute")
    healthy = Tuning(acceptance_rate=0.7)
    held = scraped(decode)
    for _ in range(8):
        assert load(router) == [200] * REQUESTS
        held = scraped(decode, held)
    reference = Reference(evidence([held], first=False))
    rules = replace(RULES, load_failure_policy="recompute")
    faults = [
        # half the pulls fail and are recomputed: each was asked for, so each is a pull
        ({"pull_failure_rate": 0.5}, Finding.PULL_FAILED, {"failed": 5, "requests": 10}),
        ({"decode_only_rate": 1.0}, Finding.DECODE_ONLY, {"decode_only": 10, "requests": 0}),
        ({"acceptance_rate": 0.3}, Finding.ACCEPTANCE_REGRESSED, {"requests": 80, "failed": 0}),
        ({}, Finding.VERIFIED, {"requests": 80, "failed": 0, "decode_only": 0}),
        # last: a real engine changes connector only by restarting, counters from zero
        ({"fixed_connector": 0}, Finding.NOT_REPORTED, {"requests": 0}),
    ]
    for changes, finding, counted in faults:
        decode.configure(**{**healthy.as_dict(), **changes})
        since = held.latest.at if held.latest else None
        # a fault in the counts shows in one load; acceptance needs 4 windows on each side
        loads = 8 if "requests" in counted and counted["requests"] == 80 else 1
        for _ in range(loads):
            assert load(router) == [200] * REQUESTS, changes  # recomputed: all answered
            held = scraped(decode, held)
        window = evidence([held], since)
        if changes.get("fixed_connector") == 0:
            # no hand-off series at all: the engine image without the fix
            assert held.latest is not None and held.latest.kv_pulled_requests is None
        assert {key: getattr(window, key) for key in counted} == counted, changes
        assert judge(window, reference, rules).finding == finding, changes


def test_a_failed_pull_fails_its_request_under_vllms_default_policy(
    engine: EngineFactory, start_router: RouterFactory
) -> None:
    """kv_load_failure_policy fail (vLLM's default, and the emulator's): each failed pull is a
    failed request, and the verdict says so (KVLoadFailed)."""
    decode, router = pair(engine, start_router, "fails")
    decode.configure(pull_failure_rate=0.5)
    statuses = load(router)
    assert statuses.count(500) == 5 and statuses.count(200) == 5, statuses
    handoff = evidence([scraped(decode)])
    assert (handoff.requests, handoff.failed) == (10, 5)
    verdict = judge(handoff, None, RULES)
    assert verdict.finding == Finding.LOAD_FAILED and "each failed its request" in verdict.message


def test_a_prefill_restarted_under_its_decode_fails_pulls(
    engine: EngineFactory, start_router: RouterFactory
) -> None:
    p = engine("prefill", "p", identity=Identity("p", "r1", K))
    d = engine("decode", "d", identity=Identity("d", "r1", K), pull_kv=True)
    router = start_router([p], [d])
    assert load(router.base, 2) == [200, 200]
    p.restart()  # new engine id; the router keeps sending the old one (docs/router.md)
    router.wait_all_healthy()
    assert load(router.base, 3) == [500] * 3
    handoff = evidence([scraped(d)])
    assert (handoff.requests, handoff.failed) == (5, 3)
    assert judge(handoff, None, replace(RULES, min_requests=1)).finding == Finding.LOAD_FAILED


def test_a_serving_pair_that_starts_failing_shows_in_its_recent_windows(
    engine: EngineFactory, start_router: RouterFactory
) -> None:
    decode, router = pair(engine, start_router, "serving", policy="recompute")
    assert load(router) == [200] * REQUESTS
    first = scraped(decode)
    held = scraped(decode, first)  # a window with nothing in it
    decode.configure(pull_failure_rate=1.0)
    assert load(router, 4) == [200] * 4
    held = scraped(decode, held)
    window = recent([held])
    assert (window.requests, window.failed) == (4, 4)
    rules = replace(RULES, min_requests=0, load_failure_policy="recompute")
    assert judge(evidence([held]), None, rules, failures=window).finding == Finding.PULL_FAILED
    # over what the operator saw it pulled 14 and failed 4
    assert evidence([held]).requests == REQUESTS + 4


def test_request_classes_accept_their_own_share_of_drafts(
    engine: EngineFactory, start_router: RouterFactory
) -> None:
    """Mixed traffic: a class named in the prompt drafts at its own rate, the rest at the
    engine's; the load client's --request-classes picks the classes."""
    classes = (("chat", 0.2), ("code", 0.9))
    decode, router = pair(engine, start_router, "mixed", Tuning(class_acceptance=classes))
    rates = {}
    for prefix, name in (("[class=code] ", "code"), ("[class=chat] ", "chat"), ("", "other")):
        before = scraped(decode)
        assert load(router, prefix=prefix) == [200] * REQUESTS
        window = evidence([scraped(decode, before)], before.latest.at if before.latest else None)
        assert window.drafts > 0
        rates[name] = window.accepted / (window.drafts * K)
    assert abs(rates["code"] - 0.9) < 0.05 and abs(rates["chat"] - 0.2) < 0.05, rates
    assert abs(rates["other"] - Tuning().acceptance_rate) < 0.05, rates
    assert parse_weights("code=1,chat=3") == {"code": 1.0, "chat": 3.0}


def test_the_emulated_decode_backs_off_what_its_engine_derived() -> None:
    """Given the operator's expected backoff (as a real engine's launcher enforces it), the
    emulated decode recomputes that; single-module MTP with k = 2 derives a lookahead of 1, no
    backoff, where k - 1 would be 1."""
    tuning = Tuning()
    assert HandoffCounts(2).backoff(tuning) == 1
    assert HandoffCounts(2, derived_backoff=0).backoff(tuning) == 0
    assert HandoffCounts(None, derived_backoff=2).backoff(tuning) == 0
    assert HandoffCounts(3, derived_backoff=2).backoff(replace(tuning, fixed_connector=0)) == 0

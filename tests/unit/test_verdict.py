"""The hand-off verdict (pdmtp.core.verification.verdict): each finding, its precedence, the two
windows, and properties over any counts; plus the series names shared with the engine image."""

from __future__ import annotations

import ast
from dataclasses import fields, replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pdmtp.core import promtext
from pdmtp.core.promtext import Scrape, parse_scrape
from pdmtp.core.scaling.roles import PodMetrics
from pdmtp.core.verification.verdict import (
    _COUNTS,
    Finding,
    Handoff,
    Outcome,
    Rules,
    judge,
    lifetime,
    recent,
)

REPO = Path(__file__).resolve().parents[2]
RULES = Rules(expected_backoff=2, min_requests=8, min_drafts=32, acceptance_tolerance=0.1)
HEALTHY = Handoff(
    reporting_pods=2,
    counted_pods=2,
    requests=10,
    pulled_tokens=10 * 38,
    backoff_tokens=10 * 2,
    drafts=100,
    accepted=150,
)
SERVING = replace(HEALTHY, drafts=200, accepted=300)  # 1.5 accepted tokens per draft


def finding(candidate: Handoff, reference: Handoff | None = SERVING, rules: Rules = RULES) -> str:
    return judge(candidate, reference, rules).finding


def test_a_healthy_revision_is_verified() -> None:
    verdict = judge(HEALTHY, SERVING, RULES)
    assert (verdict.outcome, verdict.finding) == (Outcome.VERIFIED, Finding.VERIFIED)
    assert verdict.message == (
        "10 request(s) pulled KV with the backoff of 2, no failure, "
        "1.50 accepted token(s) per draft"
    )


@pytest.mark.parametrize(
    ("candidate", "expected"),
    [
        (Handoff(), Finding.NO_METRICS),
        (replace(HEALTHY, counted_pods=1), Finding.NOT_REPORTED),
        (replace(HEALTHY, failed=1), Finding.PULL_FAILED),
        (replace(HEALTHY, decode_only=1), Finding.DECODE_ONLY),
        # the stock connector: a pull of the whole prompt, nothing recomputed
        (replace(HEALTHY, backoff_tokens=0), Finding.BACKOFF_MISMATCH),
        (replace(HEALTHY, backoff_tokens=10 * 3), Finding.BACKOFF_MISMATCH),
        (replace(HEALTHY, requests=7, backoff_tokens=14), Finding.AWAITING_REQUESTS),
        (replace(HEALTHY, drafts=31, accepted=40), Finding.AWAITING_DRAFTS),
        # 1.34 per draft: below 1.5 less 10 % (1.35)
        (replace(HEALTHY, accepted=134), Finding.ACCEPTANCE_REGRESSED),
        (replace(HEALTHY, accepted=135), Finding.VERIFIED),
        # a prompt no longer than the backoff is pulled whole: the mean falls below 2
        (replace(HEALTHY, backoff_tokens=19), Finding.VERIFIED),
    ],
)
def test_each_finding(candidate: Handoff, expected: Finding) -> None:
    assert finding(candidate) == expected


def test_failures_come_before_waiting_for_evidence() -> None:
    """A revision whose first pull failed fails now; it does not wait for its 8 requests."""
    early = replace(HEALTHY, requests=1, backoff_tokens=2, failed=1, drafts=0, accepted=0)
    assert judge(early, SERVING, RULES).outcome == Outcome.FAILED


@pytest.mark.parametrize(
    ("reference", "expected_acceptance", "accepted", "expected"),
    [
        # the serving revision has not drafted enough: the spec's expectation (1.0) holds it
        (replace(SERVING, drafts=10, accepted=30), 1.0, 95, Finding.VERIFIED),
        (replace(SERVING, drafts=10, accepted=30), 1.0, 85, Finding.ACCEPTANCE_REGRESSED),
        # no reference at all and no expectation: acceptance is not judged
        (None, None, 0, Finding.VERIFIED),
        (None, 2.0, 150, Finding.ACCEPTANCE_REGRESSED),
        # a serving revision that drafted enough is the reference, not the spec
        (SERVING, 3.0, 150, Finding.VERIFIED),
    ],
)
def test_the_reference_acceptance(
    reference: Handoff | None, expected_acceptance: float | None, accepted: int, expected: Finding
) -> None:
    rules = replace(RULES, expected_acceptance=expected_acceptance)
    assert finding(replace(HEALTHY, accepted=accepted), reference, rules) == expected


def _metrics(latest: Scrape | None, previous: Scrape | None = None) -> PodMetrics:
    return PodMetrics(latest, previous)


def test_lifetime_sums_each_pods_latest_and_recent_the_increase() -> None:
    a0 = Scrape(at=1.0, kv_pulled_requests=4, kv_backoff_tokens=8, drafts=10, accepted_tokens=12)
    a1 = Scrape(at=6.0, kv_pulled_requests=6, kv_backoff_tokens=12, drafts=16, accepted_tokens=20)
    # b restarted between its scrapes: its counters start again from zero
    b0 = Scrape(at=1.0, kv_pulled_requests=9, failed_recvs=1)
    b1 = Scrape(at=6.0, kv_pulled_requests=2)
    pods = [_metrics(a1, a0), _metrics(b1, b0), _metrics(None)]
    assert lifetime(pods) == Handoff(
        reporting_pods=2, counted_pods=2, requests=8, backoff_tokens=12, drafts=16, accepted=20
    )
    assert recent(pods) == Handoff(
        reporting_pods=2, counted_pods=2, requests=4, backoff_tokens=4, drafts=6, accepted=8
    )
    # a scrape that is not newer than the one before gives no window
    assert recent([_metrics(a0, a0)]) == Handoff()
    # an engine without the connector: scraped, but no hand-off counts
    assert lifetime([_metrics(Scrape(at=1.0, drafts=3))]).counted_pods == 0


def test_the_reader_takes_the_series_the_engine_exports() -> None:
    text = "\n".join(
        [
            "# HELP pdmtp:kv_pulled_requests_total Requests ...",
            'pdmtp:kv_pulled_requests_total{engine="0",model_name="m"} 3.0',
            'pdmtp:kv_pulled_requests_total{engine="1",model_name="m"} 2.0',
            'pdmtp:kv_pulled_requests_created{engine="0",model_name="m"} 1.7e9',
            'pdmtp:kv_pulled_tokens_total{engine="0",model_name="m"} 190.0',
            'pdmtp:kv_backoff_tokens_total{engine="0",model_name="m"} 10.0',
            'pdmtp:kv_decode_only_requests_total{engine="0",model_name="m"} 0.0',
            'vllm:mooncake_num_failed_recvs_total{engine="0",model_name="m"} 1.0',
        ]
    )
    assert parse_scrape(text, at=5.0) == Scrape(
        at=5.0,
        kv_pulled_requests=5,
        kv_pulled_tokens=190,
        kv_backoff_tokens=10,
        kv_decode_only_requests=0,
        failed_recvs=1,
    )


def test_the_series_names_are_the_engine_images() -> None:
    """pdmtp_engine.handoff (in the engine image, which imports vLLM) names the series; the
    operator reads them under the same names."""
    tree = ast.parse((REPO / "images/engine/pdmtp_engine/handoff.py").read_text())
    counters = next(
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and node.target.id == "COUNTERS"
    )
    exported = {
        key.value: value.elts[0].value  # type: ignore[attr-defined]
        for key, value in zip(counters.keys, counters.values, strict=True)  # type: ignore[attr-defined]
    }
    read = {
        "pulled_requests": promtext.KV_PULLED_REQUESTS,
        "pulled_tokens": promtext.KV_PULLED_TOKENS,
        "backoff_tokens": promtext.KV_BACKOFF_TOKENS,
        "decode_only_requests": promtext.KV_DECODE_ONLY_REQUESTS,
    }
    assert exported == read
    assert set(_COUNTS) == {f.name for f in fields(Handoff)} - {"reporting_pods", "counted_pods"}


# ---- properties -----------------------------------------------------------------------------

counts = st.integers(0, 10_000).map(float)


@st.composite
def handoffs(draw: st.DrawFn) -> Handoff:
    reporting = draw(st.integers(0, 4))
    requests = draw(counts)
    return Handoff(
        reporting_pods=reporting,
        counted_pods=draw(st.integers(0, reporting)),
        requests=requests,
        pulled_tokens=draw(counts),
        backoff_tokens=draw(st.sampled_from([requests * 2, requests, 0.0, requests * 3])),
        decode_only=draw(st.sampled_from([0.0, 0.0, 1.0])),
        failed=draw(st.sampled_from([0.0, 0.0, 2.0])),
        drafts=(drafts := draw(counts)),
        accepted=draw(st.integers(0, 3 * int(drafts)).map(float)),
    )


rules_strategy = st.builds(
    Rules,
    expected_backoff=st.integers(0, 3),
    min_requests=st.integers(1, 50),
    min_drafts=st.integers(1, 100),
    acceptance_tolerance=st.sampled_from([0.0, 0.05, 0.1, 0.5]),
    expected_acceptance=st.none() | st.floats(0.0, 3.0),
)


@given(candidate=handoffs(), reference=st.none() | handoffs(), rules=rules_strategy)
def test_verified_means_every_check_passed(
    candidate: Handoff, reference: Handoff | None, rules: Rules
) -> None:
    verdict = judge(candidate, reference, rules)
    assert verdict.handoff == candidate
    if verdict.outcome != Outcome.VERIFIED:
        return
    assert candidate.reporting_pods == candidate.counted_pods > 0
    assert candidate.failed == candidate.decode_only == 0
    assert candidate.requests >= rules.min_requests
    assert candidate.backoff_tokens <= candidate.requests * rules.expected_backoff
    if reference is not None and reference.drafts >= rules.min_drafts:
        assert reference.acceptance is not None and candidate.acceptance is not None
        assert candidate.acceptance >= reference.acceptance * (1 - rules.acceptance_tolerance)


@given(candidate=handoffs(), reference=st.none() | handoffs(), rules=rules_strategy)
def test_a_failed_pull_or_a_decode_only_request_always_fails_a_reporting_revision(
    candidate: Handoff, reference: Handoff | None, rules: Rules
) -> None:
    reporting = replace(candidate, reporting_pods=2, counted_pods=2)
    for broken in (replace(reporting, failed=1), replace(reporting, decode_only=1)):
        assert judge(broken, reference, rules).outcome == Outcome.FAILED


@given(
    candidate=handoffs(),
    reference=st.none() | handoffs(),
    rules=rules_strategy,
    more=st.integers(0, 1_000),
)
def test_more_accepted_tokens_never_turn_a_verdict_worse(
    candidate: Handoff, reference: Handoff | None, rules: Rules, more: int
) -> None:
    rank = {Outcome.FAILED: 0, Outcome.PENDING: 1, Outcome.VERIFIED: 2}
    before = judge(candidate, reference, rules).outcome
    after = judge(replace(candidate, accepted=candidate.accepted + more), reference, rules).outcome
    assert rank[after] >= rank[before]

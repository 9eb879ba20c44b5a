"""The hand-off verdict (pdmtp.core.verification.verdict): each finding and its precedence, the
windows it reads (`core.windows`), its sequential tests (`core.verification.statistics`) proven
on their defining properties, properties of `judge` over any windows, and the series names
shared with the engine image. Unit tier, ~4 s."""

from __future__ import annotations

import ast
import itertools
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pdmtp.core import promtext
from pdmtp.core.promtext import Scrape, parse_scrape
from pdmtp.core.verification import statistics as stats
from pdmtp.core.verification.statistics import (
    RatioSample,
    acceptance_llr,
    ceiling_llr,
    rate_llr,
    ratio_sample,
    relative_variance,
)
from pdmtp.core.verification.verdict import (
    Finding,
    Handoff,
    Outcome,
    Reference,
    Rules,
    evidence,
    judge,
    recent,
    started,
)
from pdmtp.core.windows import MAX_WINDOWS, PodMetrics, Window, between, record

REPO = Path(__file__).resolve().parents[2]
RULES = Rules(expected_backoff=2)


def windows(
    count: int = 12,
    *,
    requests: float = 10,
    drafts: float = 100,
    accepted: tuple[float, ...] = (140, 160),
    failed: float = 0,
    decode_only: float = 0,
    backoff: int = 2,
    start: float = 0,
) -> tuple[Window, ...]:
    """`count` windows of 15 s, each of `requests` pulls and `drafts` drafts; the accepted
    tokens cycle through `accepted` (1.4 and 1.6 per draft: a spread to measure)."""
    return tuple(
        Window(
            start + 15 * i,
            start + 15 * (i + 1),
            requests=requests,
            pulled_tokens=requests * 40,
            backoff_tokens=requests * backoff,
            failed=failed,
            decode_only=decode_only,
            drafts=drafts,
            accepted=accepted[i % len(accepted)],
        )
        for i in range(count)
    )


def pod(ws: tuple[Window, ...], counted: bool = True) -> PodMetrics:
    """A decode pod whose scraper holds `ws` (its latest scrape after the last of them)."""
    end = ws[-1].end if ws else 0.0
    latest = Scrape(end, kv_pulled_requests=sum(w.requests for w in ws) if counted else None)
    return PodMetrics(latest, None, ws)


def handoff(*ws: tuple[Window, ...]) -> Handoff:
    return evidence([pod(w) for w in ws])


HEALTHY = handoff(windows(), windows())
SERVING = Reference(handoff(windows(), windows()))


def finding(
    candidate: Handoff, reference: Reference | None = SERVING, rules: Rules = RULES
) -> Finding:
    return judge(candidate, reference, rules).finding


def test_a_healthy_revision_is_verified() -> None:
    verdict = judge(HEALTHY, SERVING, RULES)
    assert (verdict.outcome, verdict.finding) == (Outcome.VERIFIED, Finding.VERIFIED)
    assert verdict.message == (
        "240 request(s) pulled KV with the backoff of 2, 0 failed, 1.500 accepted token(s) per "
        "draft against the serving revision's 1.500 (+0.0%)"
    )
    assert verdict.handoff == HEALTHY and HEALTHY.sample.windows == 24


@pytest.mark.parametrize(
    ("candidate", "expected"),
    [
        (Handoff(), Finding.NO_METRICS),
        (evidence([pod(windows()), pod(windows(), counted=False)]), Finding.NOT_REPORTED),
        # most pulls failed: at once, whatever the reference
        (handoff(windows(1, requests=4, failed=3)), Finding.LOAD_FAILED),
        # ten times the serving revision's rate: 30 of 240 here, 0 there
        (handoff(windows(failed=2.5)), Finding.LOAD_FAILED),
        (handoff(windows(decode_only=2.5)), Finding.DECODE_ONLY),
        (handoff(windows(1, requests=1, decode_only=4)), Finding.DECODE_ONLY),
        # the stock connector: a pull of the whole prompt, nothing recomputed
        (handoff(windows(backoff=0)), Finding.BACKOFF_MISMATCH),
        (handoff(windows(backoff=3)), Finding.BACKOFF_MISMATCH),
        (handoff(windows(2, requests=3)), Finding.AWAITING_REQUESTS),
        # 3 windows with drafts: the variance needs 4
        (handoff(windows(3)), Finding.AWAITING_DRAFTS),
        (handoff(windows(12, drafts=2, accepted=(3, 3))), Finding.AWAITING_DRAFTS),
        # 20 % fewer accepted tokens per draft
        (
            handoff(windows(accepted=(112, 128)), windows(accepted=(112, 128))),
            Finding.ACCEPTANCE_REGRESSED,
        ),
        # 4 % fewer, on this evidence: not conclusive either way
        (handoff(windows(8, accepted=(130, 158))), Finding.AWAITING_DRAFTS),
        # a prompt no longer than the backoff is pulled whole: the mean falls below 2
        (replace(HEALTHY, backoff_tokens=HEALTHY.backoff_tokens - 1), Finding.VERIFIED),
    ],
)
def test_each_finding(candidate: Handoff, expected: Finding) -> None:
    assert finding(candidate) == expected


def test_a_failed_pull_under_recompute_is_a_pull_failure_not_a_failed_request() -> None:
    failing = handoff(windows(1, requests=4, failed=3))
    recompute = judge(failing, SERVING, replace(RULES, load_failure_policy="recompute"))
    assert recompute.finding == Finding.PULL_FAILED
    assert "each was recomputed by the decode" in recompute.message
    fail = judge(failing, SERVING, RULES)
    assert fail.finding == Finding.LOAD_FAILED and "each failed its request" in fail.message


def test_failures_come_before_waiting_for_evidence() -> None:
    """A revision whose first pulls failed fails now; it does not wait for its 8 requests."""
    early = handoff(windows(1, requests=3, failed=3, drafts=0))
    assert judge(early, SERVING, RULES).outcome == Outcome.FAILED


def test_failures_as_frequent_as_the_serving_revisions_pass() -> None:
    """A background of failed pulls (a restarted prefill, a timeout under load) fails no new
    revision that shares it: 1 in 100 on both sides, over 240 requests each."""
    background = replace(SERVING.handoff, failed=2.4)
    candidate = replace(HEALTHY, failed=2.4, decode_only=2.4)
    reference = Reference(replace(background, decode_only=2.4))
    assert judge(candidate, reference, RULES).outcome == Outcome.VERIFIED
    # the same 2.4 failures against a serving revision with none: still within the bound
    assert judge(candidate, SERVING, RULES).outcome == Outcome.VERIFIED


@pytest.mark.parametrize(
    ("failed", "requests", "expected"),
    [
        (5, 20, Outcome.FAILED),  # 25 %: over the 1 % ceiling on 20 requests
        (1, 500, Outcome.VERIFIED),  # 1 in 500: a background
        (3, 100, Outcome.VERIFIED),  # 3 %: not enough to tell from the ceiling yet
        (12, 100, Outcome.FAILED),
    ],
)
def test_a_revision_alone_is_held_to_an_absolute_ceiling(
    failed: float, requests: float, expected: Outcome
) -> None:
    alone = handoff(windows(10, requests=requests / 10, failed=failed / 10))
    assert judge(alone, None, RULES).outcome == expected


@pytest.mark.parametrize(
    ("reference", "expected_acceptance", "accepted", "expected"),
    [
        # drafting differently (another k): the spec's expectation holds it, if any
        (replace(SERVING, drafts_alike=False), None, (100, 110), Finding.VERIFIED),
        (replace(SERVING, drafts_alike=False), 1.5, (100, 110), Finding.ACCEPTANCE_REGRESSED),
        (replace(SERVING, drafts_alike=False), 1.5, (148, 152), Finding.VERIFIED),
        # no reference at all and no expectation: acceptance is not judged
        (None, None, (10, 12), Finding.VERIFIED),
        (None, 2.0, (140, 160), Finding.ACCEPTANCE_REGRESSED),
        # a serving revision that drafted enough is the reference, not the spec
        (SERVING, 3.0, (140, 160), Finding.VERIFIED),
        # one that has not drafted enough over the span yet: wait for it
        (Reference(handoff(windows(3))), None, (140, 160), Finding.AWAITING_DRAFTS),
        (Reference(handoff(windows(3))), 1.5, (140, 160), Finding.VERIFIED),
    ],
)
def test_the_reference_acceptance(
    reference: Reference | None,
    expected_acceptance: float | None,
    accepted: tuple[float, ...],
    expected: Finding,
) -> None:
    rules = replace(RULES, expected_acceptance=expected_acceptance)
    candidate = handoff(windows(accepted=accepted), windows(accepted=accepted))
    assert finding(candidate, reference, rules) == expected


def test_the_knobs_set_how_much_evidence_a_verdict_needs() -> None:
    """A 6 % drop over 160 windows: Failed when 5 % is worth catching at a 1 % false-rollback
    chance (log odds 6.5 against the 6.0 that fails), Pending on the same evidence at 0.1 % (6.9
    fails), Verified when only drops of 30 % matter."""
    lower = handoff(*(windows(40, accepted=(121, 161)) for _ in range(2)))
    reference = Reference(handoff(*(windows(40, accepted=(130, 170)) for _ in range(2))))
    fine = replace(RULES, smallest_regression=0.05)
    assert finding(lower, reference, fine) == Finding.ACCEPTANCE_REGRESSED
    assert finding(lower, reference, replace(fine, false_rollback=0.001)) == Finding.AWAITING_DRAFTS
    assert finding(lower, reference, replace(RULES, smallest_regression=0.3)) == Finding.VERIFIED


# ---- the windows ------------------------------------------------------------------------------


def test_a_window_is_the_counters_increase_and_a_restart_counts_from_zero() -> None:
    a = Scrape(1.0, kv_pulled_requests=4, kv_backoff_tokens=8, drafts=10, accepted_tokens=12)
    b = Scrape(16.0, kv_pulled_requests=6, kv_backoff_tokens=12, drafts=16, accepted_tokens=20)
    assert between(a, b) == Window(1.0, 16.0, requests=2, backoff_tokens=4, drafts=6, accepted=8)
    assert between(None, a) == Window(
        None, 1.0, requests=4, backoff_tokens=8, drafts=10, accepted=12
    )
    restarted = Scrape(31.0, kv_pulled_requests=1, failed_recvs=1)
    assert between(b, restarted) == Window(16.0, 31.0, requests=1, failed=1)


def test_the_history_keeps_every_count_in_coarser_windows_when_full() -> None:
    held: tuple[Window, ...] = ()
    previous = None
    for i in range(MAX_WINDOWS * 3):
        scrape = Scrape(float(i), drafts=float(10 * i), accepted_tokens=float(15 * i))
        held = record(held, previous, scrape)
        previous = scrape
        assert len(held) <= MAX_WINDOWS
    assert sum(w.drafts for w in held) == 10 * (MAX_WINDOWS * 3 - 1)
    assert all(w.end == later.start for w, later in itertools.pairwise(held))
    assert record(held, previous, previous) == held  # a scrape no newer adds nothing
    metrics = PodMetrics().scraped(Scrape(1.0, drafts=3.0)).scraped(Scrape(1.0, drafts=9.0))
    assert len(metrics.windows) == 1 and metrics.latest == Scrape(1.0, drafts=3.0)


def test_the_evidence_selects_windows_by_time_and_recent_ones_by_pod() -> None:
    early = windows(4, start=0)  # 0..60
    late = windows(4, start=60)  # 60..120
    first = (Window(None, 0.0, requests=500, drafts=9000, accepted=1),)
    m = pod(first + early + late)
    assert evidence([m]).requests == 500 + 80
    assert evidence([m], since=60.0).requests == 40
    assert evidence([m], first=False).requests == 80
    assert recent([m]).requests == 40 and recent([m], last=1).requests == 10
    assert recent([pod(first)]).requests == 0  # an engine's whole life is not recent
    assert started([m, pod(late)]) == 0.0 and started([pod(late)]) == 60.0
    assert started([PodMetrics()]) is None


# ---- the statistics ---------------------------------------------------------------------------


@given(share=st.floats(0.01, 0.99))
def test_the_rate_test_is_a_martingale_when_the_rates_are_equal(share: float) -> None:
    """Each event falls on the candidate with its share of the requests: the likelihood ratio's
    expected growth per event is exactly 1, which is what bounds its chance of ever reaching
    1/alpha (Ville's inequality)."""
    exposure, reference = 1000 * share, 1000 * (1 - share)
    mine = math.exp(rate_llr(1, exposure, 0, reference))
    theirs = math.exp(rate_llr(0, exposure, 1, reference))
    assert share * mine + (1 - share) * theirs == pytest.approx(1.0)


def test_the_ceiling_test_is_a_martingale_at_the_ceiling() -> None:
    failed, served = math.exp(ceiling_llr(1, 1)), math.exp(ceiling_llr(0, 1))
    assert stats.CEILING * failed + (1 - stats.CEILING) * served == pytest.approx(1.0)


@given(
    rate=st.floats(0, 0.2),
    exposure=st.floats(1, 10_000),
    reference=st.floats(1, 10_000),
    theirs_higher=st.floats(1, 3),
)
def test_failures_in_no_higher_proportion_never_count_against_a_candidate(
    rate: float, exposure: float, reference: float, theirs_higher: float
) -> None:
    llr = rate_llr(rate * exposure, exposure, rate * theirs_higher * reference, reference)
    assert llr <= 1e-9


def test_the_cluster_variance_is_measured_from_the_windows() -> None:
    """The linearised variance of a ratio over windows, by hand, and the covariance of a pod's
    neighbouring windows: requests that span a scrape are in both."""
    a, d = [1600.0, 1700.0, 900.0, 1000.0], [1000.0, 1000.0, 1000.0, 1000.0]
    ws = tuple(Window(float(i), i + 1.0, drafts=d[i], accepted=a[i]) for i in range(4))
    r = sum(a) / sum(d)
    e = [a[i] - r * d[i] for i in range(4)]
    squares = sum(x * x for x in e)

    def by_hand(lags: float) -> float:
        return 4 / 3 * max(squares + 2 * lags, squares / 2) / sum(a) ** 2

    one_pod = sum(e[i] * e[i - 1] for i in range(1, 4))
    assert relative_variance(ratio_sample([ws])) == pytest.approx(by_hand(one_pod))
    # two pods: no lag across them
    two_pods = e[1] * e[0] + e[3] * e[2]
    assert relative_variance(ratio_sample([ws[:2], ws[2:]])) == pytest.approx(by_hand(two_pods))
    assert by_hand(one_pod) != pytest.approx(by_hand(two_pods))
    # identical windows vary not at all: the floor of independent drafts holds
    same = ratio_sample([windows(8, accepted=(150,))])
    assert relative_variance(same) == stats.DRAFT_VARIANCE_FLOOR / 800


def test_acceptance_evidence_points_the_right_way() -> None:
    c = ratio_sample([windows(20, accepted=(140, 160))])
    r = ratio_sample([windows(20, accepted=(140, 160))])
    assert acceptance_llr(c, r, 0.1) < 0  # as good: evidence for no drop
    worse = ratio_sample([windows(20, accepted=(126, 144))])  # 10 % fewer
    assert acceptance_llr(worse, r, 0.1) > 0
    assert acceptance_llr(worse, 1.5, 0.1) > acceptance_llr(worse, r, 0.1)  # a known reference


@pytest.mark.parametrize("reference", ["serving revision", "expected value"])
def test_a_drafter_that_accepts_almost_nothing_is_failed(reference: str) -> None:
    """The worst regression is the surest: 1 token in 80 drafts against 3 per draft. Measured
    against the candidate's own near-zero ratio its variance had no bound, and a drafter
    accepting 0.008 per draft stayed Pending on the CPU tier's real engines."""
    broken = ratio_sample([windows(9, drafts=8, accepted=(0, 0, 1, 0, 0, 0, 0, 0, 0))])
    serving = ratio_sample([windows(9, drafts=8, accepted=(24,))])
    against: RatioSample | float = serving if reference == "serving revision" else 3.0
    llr = acceptance_llr(broken, against, 0.1)
    assert llr >= stats.fail_at(0.01 * stats.ALPHA_SHARES["acceptance"]), llr


# ---- properties -------------------------------------------------------------------------------


@st.composite
def pods(draw: st.DrawFn) -> list[PodMetrics]:
    out = []
    for _ in range(draw(st.integers(0, 3))):
        count = draw(st.integers(0, 14))
        ws = []
        for i in range(count):
            requests = draw(st.integers(0, 40))
            drafts = draw(st.integers(0, 400))
            ws.append(
                Window(
                    15.0 * i,
                    15.0 * (i + 1),
                    requests=requests,
                    pulled_tokens=requests * 30,
                    backoff_tokens=requests * draw(st.sampled_from([2, 2, 2, 1, 3, 0])),
                    failed=draw(st.sampled_from([0, 0, 0, 1, 5])),
                    decode_only=draw(st.sampled_from([0, 0, 0, 1])),
                    drafts=drafts,
                    accepted=draw(st.integers(0, 3 * drafts)),
                )
            )
        out.append(pod(tuple(ws), counted=draw(st.sampled_from([True, True, True, False]))))
    return out


rules_strategy = st.builds(
    Rules,
    expected_backoff=st.integers(0, 3),
    false_rollback=st.sampled_from([0.001, 0.01, 0.1]),
    smallest_regression=st.sampled_from([0.05, 0.1, 0.3]),
    min_requests=st.integers(1, 50),
    min_drafts=st.integers(1, 100),
    expected_acceptance=st.none() | st.floats(0.1, 3.0),
    load_failure_policy=st.sampled_from(["fail", "recompute"]),
)


@settings(max_examples=150, deadline=None)
@given(candidate=pods(), reference=st.none() | pods(), rules=rules_strategy)
def test_verified_means_every_check_passed(
    candidate: list[PodMetrics], reference: list[PodMetrics] | None, rules: Rules
) -> None:
    c = evidence(candidate)
    against = None if reference is None else Reference(evidence(reference))
    verdict = judge(c, against, rules)
    assert verdict.handoff == c
    if verdict.outcome != Outcome.VERIFIED:
        return
    assert c.reporting_pods == c.counted_pods > 0
    assert c.requests >= rules.min_requests
    assert c.backoff_tokens <= c.requests * (rules.expected_backoff or 0)
    assert c.failed < max(stats.GROSS_FAILURES, c.exposure - c.failed + 1e-9)
    reference = None if against is None else against.handoff
    if (
        reference is not None
        and reference.sample.windows >= stats.MIN_WINDOWS
        and reference.drafts >= rules.min_drafts
    ):
        assert c.sample.windows >= stats.MIN_WINDOWS and c.drafts >= rules.min_drafts
        llr = acceptance_llr(c.sample, reference.sample, rules.smallest_regression)
        assert llr <= stats.pass_at()


@settings(max_examples=150, deadline=None)
@given(
    candidate=pods(),
    reference=st.none() | pods(),
    rules=rules_strategy,
    factor=st.floats(1.0, 3.0),
)
def test_more_accepted_tokens_in_every_window_never_turn_a_verdict_worse(
    candidate: list[PodMetrics], reference: list[PodMetrics] | None, rules: Rules, factor: float
) -> None:
    rank = {Outcome.FAILED: 0, Outcome.PENDING: 1, Outcome.VERIFIED: 2}
    against = None if reference is None else Reference(evidence(reference))
    before = judge(evidence(candidate), against, rules).outcome
    better = [
        replace(m, windows=tuple(replace(w, accepted=w.accepted * factor) for w in m.windows))
        for m in candidate
    ]
    after = judge(evidence(better), against, rules).outcome
    assert rank[after] >= rank[before]


# ---- the series -------------------------------------------------------------------------------


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
    # The drafter refresh is the connector's own repair (docs/design.md, "MTP acceptance through
    # the hand-off"): what it costs shows in acceptance, which is judged; its count is for people.
    not_read = {"refreshed_tokens": "pdmtp:kv_refreshed_tokens"}
    assert exported == read | not_read


def test_a_ratio_sample_adds_up() -> None:
    one, two = ratio_sample([windows(3)]), ratio_sample([windows(5)])
    assert one + two == ratio_sample([windows(3), windows(5)])
    assert RatioSample() + one == one

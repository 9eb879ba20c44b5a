"""Whether a revision's P/D path works, judged on what its decode engines did (issue 41), with
tests whose chance of failing a healthy revision over a whole rollout is bounded (issue 50).

Ready says an engine started. It does not say that the decode pulled the prefill's KV, that the
pair applied the MTP backoff, or that drafts are still accepted as often as before: a connector
that does not back off leaves stale draft KV, and the only symptom is a lower acceptance rate
(vLLM #55055). The fixed connector counts the hand-off on each decode (`pdmtp_engine.handoff`),
vLLM counts failed receives and drafts; the scraper keeps each decode's counts as windows
between its scrapes (`core.windows`). `judge` reads a revision's windows against the backoff the
operator derived and against the revision that serves beside it over the same span, with the
sequential tests of `core.verification.statistics`:

- failed pulls and decode-only requests: most of them failing fails at once; else their rate
  against the serving revision's (or, alone, against an absolute ceiling);
- the backoff recomputed per request, against the derived one (exact: no healthy pair differs);
- accepted tokens per draft against the serving revision's (or the spec's expected value),
  Verified once the test accepts "no regression", Failed once it accepts "regressed by
  smallestRegressionPercent", Pending in between.

Pure: windows in, a verdict out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Literal

from pdmtp.api import reasons
from pdmtp.core.verification import statistics as st
from pdmtp.core.verification.statistics import RatioSample
from pdmtp.core.windows import PodMetrics, Window

LoadFailurePolicy = Literal["recompute", "fail"]
RECENT_WINDOWS = 4
"""A revision that rolled out is judged on each decode's last windows: about a minute at the
default interval, so a fault shows within a minute and a recovered blip stops counting."""


class Outcome(StrEnum):
    PENDING = "Pending"
    """Not enough evidence yet: too few requests, drafts or windows, or no metrics."""
    VERIFIED = "Verified"
    FAILED = "Failed"


class Finding(StrEnum):
    """Why the verdict is what it is (the Verified condition's reason, `pdmtp.api.reasons`); the
    first that applies, in this order of precedence."""

    NO_METRICS = reasons.NO_METRICS
    NOT_REPORTED = reasons.HANDOFF_NOT_REPORTED
    PULL_FAILED = reasons.KV_PULL_FAILED
    LOAD_FAILED = reasons.KV_LOAD_FAILED
    DECODE_ONLY = reasons.DECODE_ONLY_FALLBACK
    BACKOFF_MISMATCH = reasons.BACKOFF_MISMATCH
    AWAITING_REQUESTS = reasons.AWAITING_REQUESTS
    AWAITING_DRAFTS = reasons.AWAITING_DRAFTS
    ACCEPTANCE_REGRESSED = reasons.ACCEPTANCE_REGRESSED
    VERIFIED = reasons.HANDOFF_VERIFIED


@dataclass(frozen=True)
class Handoff:
    """What a revision's decode pods did over the windows judged, summed over the pods."""

    reporting_pods: int = 0
    """Decode pods with a usable scrape."""
    counted_pods: int = 0
    """Of those, the pods whose scrape carries the hand-off counts."""
    requests: float = 0.0
    """Requests that asked a prefill for their KV (a failed pull among them)."""
    pulled_tokens: float = 0.0
    backoff_tokens: float = 0.0
    decode_only: float = 0.0
    failed: float = 0.0
    drafts: float = 0.0
    accepted: float = 0.0
    sample: RatioSample = field(default_factory=RatioSample)
    """The windows' sums for the acceptance test's variance."""

    @property
    def acceptance(self) -> float | None:
        """Accepted tokens per draft; None before the first draft."""
        return self.accepted / self.drafts if self.drafts > 0 else None

    @property
    def backoff_per_request(self) -> float | None:
        return self.backoff_tokens / self.requests if self.requests > 0 else None

    @property
    def exposure(self) -> float:
        """Requests that reached the decodes: those that asked for KV and those served without."""
        return self.requests + self.decode_only


@dataclass(frozen=True)
class Reference:
    """The revision that serves beside the candidate, over the candidate's span."""

    handoff: Handoff
    drafts_alike: bool = True
    """Both draft alike (the same speculative config): only then is acceptance compared
    (accepted tokens per draft grow with the tokens drafted)."""


@dataclass(frozen=True)
class Rules:
    """How a verdict is reached (spec.verification, `core.verification.revisions.rules_of`)."""

    expected_backoff: int | None
    """The backoff the operator derived from the lookahead (`pdmtp.core.lookahead`); None where
    it could not (the decode pod does not say), and the recomputed tokens are not judged."""
    false_rollback: float = 0.01
    """The chance of failing a healthy revision over its whole rollout."""
    smallest_regression: float = 0.1
    """The relative drop of accepted tokens per draft worth catching."""
    min_requests: int = 8
    """Pulled requests needed before a revision can be Verified."""
    min_drafts: int = 32
    """Drafts needed, on each side, before acceptance is judged."""
    expected_acceptance: float | None = None
    """Accepted tokens per draft to hold a revision to when no other revision gives a reference."""
    load_failure_policy: LoadFailurePolicy = "fail"
    """What the decodes do with a failed KV load (vLLM's default: fail the request)."""


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    finding: Finding
    message: str
    handoff: Handoff
    expected_backoff: int | None = None
    """The backoff it was judged against (`Rules.expected_backoff`)."""


_COUNTS = (  # the Handoff fields summed from each window
    "requests",
    "pulled_tokens",
    "backoff_tokens",
    "decode_only",
    "failed",
    "drafts",
    "accepted",
)


def evidence(
    decode_pods: Iterable[PodMetrics], since: float | None = None, first: bool = True
) -> Handoff:
    """What the pods counted over their windows: those that end after `since` (all without
    it); a pod's first window (counted from its engine's start, before the operator saw it)
    only with `first`."""
    return _summed(
        decode_pods,
        lambda windows: [
            w
            for w in windows
            if (since is None or w.end > since) and (first or w.start is not None)
        ],
    )


def recent(decode_pods: Iterable[PodMetrics], last: int = RECENT_WINDOWS) -> Handoff:
    """What the pods counted over each one's `last` windows between two scrapes the operator
    saw (a pod's first window, its engine's whole life, is not recent)."""
    return _summed(decode_pods, lambda windows: [w for w in windows if w.start is not None][-last:])


def started(decode_pods: Iterable[PodMetrics]) -> float | None:
    """When the pods' evidence begins: their earliest window's opening (its end where it counts
    from the engine's start); None before any window."""
    times = [w.end if w.start is None else w.start for m in decode_pods for w in m.windows[:1]]
    return min(times) if times else None


def _summed(
    decode_pods: Iterable[PodMetrics], select: Callable[[Sequence[Window]], Sequence[Window]]
) -> Handoff:
    totals = dict.fromkeys(_COUNTS, 0.0)
    reporting = counted = 0
    kept: list[Sequence[Window]] = []
    for m in decode_pods:
        if m.latest is None:
            continue
        reporting += 1
        counted += m.latest.kv_pulled_requests is not None
        windows = select(m.windows)
        # A pod's first window counts its engine's life before the operator saw it: one cluster
        # of unknown size and span, as much evidence as all the rest after a restart. It counts,
        # but the acceptance test's sample (and its variance) is made of the windows between
        # two scrapes the operator saw.
        kept.append([w for w in windows if w.start is not None])
        for w in windows:
            for name in _COUNTS:
                totals[name] += getattr(w, name)
    return Handoff(reporting, counted, **totals, sample=st.ratio_sample(kept))


def judge(
    candidate: Handoff,
    reference: Reference | None,
    rules: Rules,
    failures: Handoff | None = None,
) -> Verdict:
    """The verdict on `candidate`, a revision's decodes over the windows judged, with
    `reference` the revision that serves beside it over the same span (None where there is
    none); `failures` are the counts its failed and decode-only pulls are judged on (by default
    the candidate's own: a revision that rolled out answers for its recent windows)."""

    judged = failures if failures is not None else candidate
    # The status shows the failures judged, beside the rest of the evidence.
    shown = replace(candidate, failed=judged.failed, decode_only=judged.decode_only)

    def verdict(outcome: Outcome, finding: Finding, message: str) -> Verdict:
        return Verdict(outcome, finding, message, shown, rules.expected_backoff)

    c = candidate
    if c.reporting_pods == 0:
        return verdict(Outcome.PENDING, Finding.NO_METRICS, "no decode pod scraped yet")
    if c.counted_pods < c.reporting_pods:
        return verdict(
            Outcome.FAILED,
            Finding.NOT_REPORTED,
            f"{c.reporting_pods - c.counted_pods} of {c.reporting_pods} decode pod(s) export no "
            "hand-off counts: their engine does not carry the fixed Mooncake connector",
        )
    against = None if reference is None else reference.handoff
    failed = _rate_fault(judged.failed, judged, against, "failed", rules)
    if failed is not None:
        fails = rules.load_failure_policy == "fail"
        return verdict(
            Outcome.FAILED,
            Finding.LOAD_FAILED if fails else Finding.PULL_FAILED,
            f"{judged.failed:g} KV receive(s) failed against {judged.requests:g} pulled "
            f"request(s), {failed}; "
            + (
                "each failed its request (kv_load_failure_policy fail)"
                if fails
                else "each was recomputed by the decode (kv_load_failure_policy recompute)"
            ),
        )
    decode_only = _rate_fault(judged.decode_only, judged, against, "decode_only", rules)
    if decode_only is not None:
        return verdict(
            Outcome.FAILED,
            Finding.DECODE_ONLY,
            f"{judged.decode_only:g} request(s) served decode-only, with no prefill's KV, "
            f"{decode_only}",
        )
    per_request = c.backoff_per_request
    # A prompt no longer than the backoff is pulled whole, so the mean may fall below the
    # backoff, never above it; none recomputed at all is the stock connector's behaviour.
    expected_backoff = rules.expected_backoff
    if (
        per_request is not None
        and expected_backoff is not None
        and (per_request > expected_backoff or (expected_backoff > 0 and per_request == 0))
    ):
        return verdict(
            Outcome.FAILED,
            Finding.BACKOFF_MISMATCH,
            f"the decodes recomputed {per_request:.2f} prompt token(s) per request, "
            f"the derived backoff is {expected_backoff}",
        )
    if c.requests < rules.min_requests:
        return verdict(
            Outcome.PENDING,
            Finding.AWAITING_REQUESTS,
            f"{c.requests:g} of {rules.min_requests} pulled request(s) seen",
        )
    acceptance = _acceptance(c, reference, rules)
    if acceptance is not None:
        outcome, finding, message = acceptance
        if outcome != Outcome.VERIFIED:
            return verdict(outcome, finding, message)
    return verdict(
        Outcome.VERIFIED,
        Finding.VERIFIED,
        f"{c.requests:g} request(s) pulled KV"
        + ("" if expected_backoff is None else f" with the backoff of {expected_backoff}")
        + f", {judged.failed:g} failed"
        + ("" if acceptance is None else f", {acceptance[2]}"),
    )


def _rate_fault(
    events: float, judged: Handoff, reference: Handoff | None, test: str, rules: Rules
) -> str | None:
    """Why `events` (failed or decode-only requests among `judged`'s) fail the revision, or
    None: most requests lost (at once), else the sequential test against the reference's rate
    over the same span, or against the absolute ceiling where there is no reference."""
    if events >= st.GROSS_FAILURES and events >= judged.exposure - events:
        return "most of them"
    threshold = st.fail_at(rules.false_rollback * st.ALPHA_SHARES[test])
    if reference is not None and reference.exposure > 0:
        theirs = reference.failed if test == "failed" else reference.decode_only
        llr = st.rate_llr(events, judged.exposure, theirs, reference.exposure)
        if llr >= threshold:
            share = f"{theirs:g} of the serving revision's {reference.exposure:g}"
            return f"a rate well above the serving revision's ({share} in the same span)"
        return None
    if judged.exposure > 0 and st.ceiling_llr(events, judged.exposure) >= threshold:
        return f"a rate above the {st.CEILING:.0%} ceiling of a revision with none beside it"
    return None


def _acceptance(
    c: Handoff, reference: Reference | None, rules: Rules
) -> tuple[Outcome, Finding, str] | None:
    """Acceptance judged against the reference's (where both draft alike and it has drafted)
    or the spec's expected value; None where there is neither."""
    against: RatioSample | float | None = None
    if (
        reference is not None
        and reference.drafts_alike
        and reference.handoff.sample.drafts >= rules.min_drafts
        and reference.handoff.sample.windows >= st.MIN_WINDOWS
    ):
        against = reference.handoff.sample
    elif rules.expected_acceptance is not None and rules.expected_acceptance > 0:
        against = rules.expected_acceptance
    elif (
        reference is not None and reference.drafts_alike and (c.drafts or reference.handoff.drafts)
    ):
        # The serving revision has drafted too little over the span yet (an operator restart
        # starts its evidence again): wait for it.
        return (
            Outcome.PENDING,
            Finding.AWAITING_DRAFTS,
            f"the serving revision drafted {reference.handoff.drafts:g} time(s) over "
            f"{reference.handoff.sample.windows:g} window(s) since this revision started; "
            f"acceptance is compared from {rules.min_drafts} drafts and {st.MIN_WINDOWS} "
            "windows on each side",
        )
    if against is None:
        return None
    if c.sample.drafts < rules.min_drafts or c.sample.windows < st.MIN_WINDOWS:
        return (
            Outcome.PENDING,
            Finding.AWAITING_DRAFTS,
            f"{c.sample.drafts:g} draft(s) over {c.sample.windows:g} window(s) seen; acceptance "
            f"is judged from {rules.min_drafts} drafts and {st.MIN_WINDOWS} windows",
        )
    drop = rules.smallest_regression
    llr = st.acceptance_llr(c.sample, against, drop)
    mine = c.sample.ratio
    theirs = against.ratio if isinstance(against, RatioSample) else against
    whose = "the serving revision's" if isinstance(against, RatioSample) else "the expected"
    figures = (
        f"{mine:.3f} accepted token(s) per draft against {whose} {theirs:.3f} "
        f"({mine / theirs - 1:+.1%})"
    )
    regressed = st.fail_at(rules.false_rollback * st.ALPHA_SHARES["acceptance"])
    if llr >= regressed:
        return (
            Outcome.FAILED,
            Finding.ACCEPTANCE_REGRESSED,
            f"{figures}: the evidence for a {drop:.0%} drop is {llr:.1f} in log odds, over the "
            f"{regressed:.1f} that fails",
        )
    if llr > st.pass_at():
        return (
            Outcome.PENDING,
            Finding.AWAITING_DRAFTS,
            f"{figures}: not conclusive yet (log odds {llr:.1f} for a {drop:.0%} drop; "
            f"{regressed:.1f} fails, {st.pass_at():.1f} passes)",
        )
    return Outcome.VERIFIED, Finding.VERIFIED, figures

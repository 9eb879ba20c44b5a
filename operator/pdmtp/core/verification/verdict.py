"""Whether a revision's P/D path works, judged on what its decode engines did (issue 41).

Ready says an engine started. It does not say that the decode pulled the prefill's KV, that the
pair applied the MTP backoff, or that drafts are still accepted as often as before: a connector
that does not back off leaves stale draft KV, and the only symptom is a lower acceptance rate
(vLLM #55055). The fixed connector counts the hand-off on each decode (`pdmtp_engine.handoff`),
vLLM counts failed receives and drafts; `judge` reads those counts, summed over a revision's
decode pods, against the backoff the operator derived and against the acceptance of the
revision that serves (or the spec's expected acceptance where none does).

Pure: scrapes in, a verdict out. Two windows: `lifetime` (everything the pods did since they
started: a new revision's pods are new, so this is all the evidence it has) and `recent` (the
increase between each pod's two latest scrapes: a serving revision that stops handing KV over).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from pdmtp.api import reasons
from pdmtp.core.promtext import Scrape
from pdmtp.core.scaling.roles import PodMetrics


class Outcome(StrEnum):
    PENDING = "Pending"
    """Not enough evidence yet: too few requests or drafts, or no metrics."""
    VERIFIED = "Verified"
    FAILED = "Failed"


class Finding(StrEnum):
    """Why the verdict is what it is (the Verified condition's reason, `pdmtp.api.reasons`); the
    first that applies, in this order of precedence."""

    NO_METRICS = reasons.NO_METRICS
    NOT_REPORTED = reasons.HANDOFF_NOT_REPORTED
    PULL_FAILED = reasons.KV_PULL_FAILED
    DECODE_ONLY = reasons.DECODE_ONLY_FALLBACK
    BACKOFF_MISMATCH = reasons.BACKOFF_MISMATCH
    AWAITING_REQUESTS = reasons.AWAITING_REQUESTS
    AWAITING_DRAFTS = reasons.AWAITING_DRAFTS
    ACCEPTANCE_REGRESSED = reasons.ACCEPTANCE_REGRESSED
    VERIFIED = reasons.HANDOFF_VERIFIED


@dataclass(frozen=True)
class Handoff:
    """What a revision's decode pods did over a window, summed over the pods."""

    reporting_pods: int = 0
    """Decode pods with a usable scrape in the window."""
    counted_pods: int = 0
    """Of those, the pods whose scrape carries the hand-off counts."""
    requests: float = 0.0
    """Requests that pulled a prefill's KV."""
    pulled_tokens: float = 0.0
    backoff_tokens: float = 0.0
    decode_only: float = 0.0
    failed: float = 0.0
    drafts: float = 0.0
    accepted: float = 0.0

    @property
    def acceptance(self) -> float | None:
        """Accepted tokens per draft; None before the first draft."""
        return self.accepted / self.drafts if self.drafts > 0 else None

    @property
    def backoff_per_request(self) -> float | None:
        return self.backoff_tokens / self.requests if self.requests > 0 else None


@dataclass(frozen=True)
class Rules:
    """How a verdict is reached; the defaults are the spec's (`pdmtp.api`) once it has them."""

    expected_backoff: int | None
    """The backoff the operator derived from the lookahead (`pdmtp.core.lookahead`); None where
    it could not (the decode pod does not say), and the recomputed tokens are not judged."""
    min_requests: int = 8
    """Pulled requests needed before a revision can be Verified."""
    min_drafts: int = 32
    """Drafts needed, on each side, before acceptance is compared."""
    acceptance_tolerance: float = 0.1
    """The relative drop of accepted tokens per draft that still passes (0.1: 10 %)."""
    expected_acceptance: float | None = None
    """Accepted tokens per draft to hold a revision to when no other revision gives a reference."""


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    finding: Finding
    message: str
    handoff: Handoff
    expected_backoff: int | None = None
    """The backoff it was judged against (`Rules.expected_backoff`)."""


_COUNTS = {
    # Handoff field -> Scrape field
    "requests": "kv_pulled_requests",
    "pulled_tokens": "kv_pulled_tokens",
    "backoff_tokens": "kv_backoff_tokens",
    "decode_only": "kv_decode_only_requests",
    "failed": "failed_recvs",
    "drafts": "drafts",
    "accepted": "accepted_tokens",
}


def lifetime(decode_pods: Iterable[PodMetrics]) -> Handoff:
    """Everything the pods counted since they started (each one's latest scrape)."""
    return _sum((m.latest, None) for m in decode_pods if m.latest is not None)


def recent(decode_pods: Iterable[PodMetrics]) -> Handoff:
    """What the pods counted between their two latest scrapes (a restart counts from zero)."""
    return _sum(
        (m.latest, m.previous)
        for m in decode_pods
        if m.latest is not None and m.previous is not None and m.previous.at < m.latest.at
    )


def _sum(windows: Iterable[tuple[Scrape, Scrape | None]]) -> Handoff:
    totals = dict.fromkeys(_COUNTS, 0.0)
    reporting = counted = 0
    for latest, previous in windows:
        reporting += 1
        counted += latest.kv_pulled_requests is not None
        for field, source in _COUNTS.items():
            totals[field] += _increase(latest, previous, source)
    return Handoff(reporting, counted, **totals)


def _increase(latest: Scrape, previous: Scrape | None, source: str) -> float:
    """A counter's increase since `previous` (all of it without one); a drop means a restart."""
    now: float | None = getattr(latest, source)
    if now is None:
        return 0.0
    before: float | None = None if previous is None else getattr(previous, source)
    if before is None or now < before:
        return now
    return now - before


def judge(candidate: Handoff, reference: Handoff | None, rules: Rules) -> Verdict:
    """The verdict on `candidate`, a revision's decodes over a window, with `reference` the
    revision that serves beside it (None where it is the only one)."""

    def verdict(outcome: Outcome, finding: Finding, message: str) -> Verdict:
        return Verdict(outcome, finding, message, candidate, rules.expected_backoff)

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
    if c.failed > 0:
        return verdict(
            Outcome.FAILED,
            Finding.PULL_FAILED,
            f"{c.failed:g} KV receive(s) failed against {c.requests:g} pulled request(s)",
        )
    if c.decode_only > 0:
        return verdict(
            Outcome.FAILED,
            Finding.DECODE_ONLY,
            f"{c.decode_only:g} request(s) served decode-only, with no prefill's KV",
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
    expected = _reference_acceptance(reference, rules)
    if expected is not None:
        if c.drafts < rules.min_drafts:
            return verdict(
                Outcome.PENDING,
                Finding.AWAITING_DRAFTS,
                f"{c.drafts:g} of {rules.min_drafts} draft(s) seen",
            )
        floor = expected * (1 - rules.acceptance_tolerance)
        acceptance = c.acceptance or 0.0
        if acceptance < floor:
            return verdict(
                Outcome.FAILED,
                Finding.ACCEPTANCE_REGRESSED,
                f"{acceptance:.2f} accepted token(s) per draft, below {floor:.2f} "
                f"({expected:.2f} less {rules.acceptance_tolerance:.0%})",
            )
    return verdict(
        Outcome.VERIFIED,
        Finding.VERIFIED,
        f"{c.requests:g} request(s) pulled KV"
        + ("" if expected_backoff is None else f" with the backoff of {expected_backoff}")
        + ", no failure"
        + ("" if c.acceptance is None else f", {c.acceptance:.2f} accepted token(s) per draft"),
    )


def _reference_acceptance(reference: Handoff | None, rules: Rules) -> float | None:
    """The serving revision's acceptance once it has drafted enough, else the spec's."""
    if reference is not None and reference.drafts >= rules.min_drafts:
        return reference.acceptance
    return rules.expected_acceptance

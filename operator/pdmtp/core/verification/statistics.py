"""The verdict's statistics: sequential tests whose chance of failing a healthy revision, over
every judgement a rollout makes, is bounded (docs/design.md, "The verdict's statistics").

Each test is a likelihood ratio between "healthy" and "regressed by the effect worth catching",
recomputed from all the evidence at every scrape. Under "healthy" the ratio is a nonnegative
martingale with mean 1, so by Ville's inequality the chance that it *ever* reaches 1/alpha is at
most alpha, however often it is looked at; under "regressed" its inverse is, so the chance of
reaching beta (Verified) first is at most beta. That is Wald's sequential probability ratio test
with the boundaries Ville's inequality guarantees.

- Accepted tokens per draft (`acceptance_llr`): the candidate's ratio over the reference's (the
  serving revision's over the same span, or the spec's expected value), healthy at 1 and
  regressed at 1 - drop. Its variance is measured, not assumed: each window of each decode pod is
  a cluster of whole requests, and the spread of the windows about the ratio (with the
  covariance of a pod's neighbouring windows, which share the requests that span a scrape) is a
  ratio estimator's cluster variance (never below `DRAFT_VARIANCE_FLOOR`). With few windows that
  estimate is itself noisy, so the variance is widened by 1 + `SMALL_SAMPLE` / df (Welch's
  degrees of freedom): the heavier tail of a studentised statistic at the test's boundary.
- Failed pulls and decode-only requests (`rate_llr`): the candidate's rate against the serving
  revision's in the same span, healthy at equal rates and regressed at `RATE_RATIO` times,
  conditional on the events both saw (each event falls on the candidate with the candidate's
  share of the requests): no variance to estimate, and a background that changes over time
  changes both alike.
- A revision with nothing to compare with (`ceiling_llr`): its failure rate against an absolute
  ceiling, healthy at `CEILING` and broken at `CEILING_BROKEN`.

Pure and written with arithmetic alone (plus `log`, which a caller may pass), so that the
simulation of whole rollouts (tests/support/verdict_sim.py) evaluates these very functions over
arrays of rollouts at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields

from pdmtp.core.windows import Window

MISSED_REGRESSION = 0.05
"""beta: the chance that a revision regressed by the effect worth catching is Verified first."""
RATE_RATIO = 10.0
"""The failure (or decode-only) rate, relative to the serving revision's, worth catching."""
CEILING = 0.01
"""A revision with nothing to compare with is healthy at this failure rate or below: a fleet's
background (a restarted prefill, a timeout under load) is well under it."""
CEILING_BROKEN = 0.10
"""... and broken at this one: ten times the ceiling, as `RATE_RATIO`."""
ALPHA_SHARES = {"acceptance": 0.25, "failed": 0.125, "decode_only": 0.125}
"""The share of the false-rollback chance each test spends (a union bound over the three).
Their sum is one half: the other half is the allowance for the normal approximation the
acceptance test rests on (the simulation measures what is really spent)."""
MIN_WINDOWS = 4
"""Windows with drafts, on each side, before acceptance is judged: the variance needs a few, and
`SMALL_SAMPLE` widens it while they are few, so a large drop is caught within a few windows and a
small one waits for the evidence it needs (in the simulation, 8 instead of 4 changed no false-
rollback share beyond noise and caught a large drop one window per pod later)."""
SMALL_SAMPLE = 20.0
"""The variance is widened by 1 + this / df (df: Welch's degrees of freedom of the windows)."""
DRAFT_VARIANCE_FLOOR = 0.05
"""The relative variance is never taken below this / drafts: that of independent drafts whose
accepted count varies as little as k = 1 at 95 % acceptance does. Real traffic varies more; an
emulated engine, which accepts a fixed share, varies not at all, and a test of zero variance
would decide on any difference."""
GROSS_FAILURES = 3
"""At least this many failures, and no fewer than the requests that went well, fail a revision
at once: no healthy revision loses most of its pulls (a background of 1 in 500 does it with a
chance below 1e-7)."""


def fail_at(alpha: float) -> float:
    """The log likelihood ratio at which "regressed" is accepted (Ville: 1/alpha)."""
    return math.log(1 / alpha)


def pass_at() -> float:
    """The log likelihood ratio at which "healthy" is accepted (Ville, under the regressed
    hypothesis: beta)."""
    return math.log(MISSED_REGRESSION)


@dataclass(frozen=True)
class RatioSample:
    """Accepted tokens per draft over a set of windows: the sums its estimate and cluster
    variance need. `lag_*` sum over the pairs of a pod's consecutive windows."""

    windows: float = 0.0
    """Windows with drafts."""
    accepted: float = 0.0
    drafts: float = 0.0
    accepted_sq: float = 0.0
    accepted_drafts: float = 0.0
    drafts_sq: float = 0.0
    lag_accepted: float = 0.0
    lag_cross: float = 0.0
    lag_drafts: float = 0.0

    def __add__(self, other: RatioSample) -> RatioSample:
        return RatioSample(
            *(getattr(self, f.name) + getattr(other, f.name) for f in fields(RatioSample))
        )

    @property
    def ratio(self) -> float:
        return self.accepted / self.drafts


def ratio_sample(pods: Iterable[Sequence[Window]]) -> RatioSample:
    """The sample of each pod's windows (given in time order), summed over the pods."""
    total = RatioSample()
    for windows in pods:
        n = a = d = aa = ad = dd = la = lx = ld = 0.0
        before: Window | None = None
        for w in windows:
            n += w.drafts > 0
            a += w.accepted
            d += w.drafts
            aa += w.accepted * w.accepted
            ad += w.accepted * w.drafts
            dd += w.drafts * w.drafts
            if before is not None:
                la += w.accepted * before.accepted
                lx += w.accepted * before.drafts + w.drafts * before.accepted
                ld += w.drafts * before.drafts
            before = w
        total = total + RatioSample(n, a, d, aa, ad, dd, la, lx, ld)
    return total


def relative_variance(s: RatioSample, scale: float | None = None) -> float:
    """Var(ratio) / scale^2 (scale: the sample's own ratio by default): the linearised cluster
    variance of a ratio estimator, with the lag-1 covariance of a pod's windows (a request that
    spans a scrape is in both); never below half the variance without it (a negative covariance
    estimate is noise)."""
    r = s.accepted / s.drafts
    plain = s.accepted_sq - 2 * r * s.accepted_drafts + r * r * s.drafts_sq
    lagged = plain + 2 * (s.lag_accepted - r * s.lag_cross + r * r * s.lag_drafts)
    kept = _larger(lagged, plain / 2)
    scaled = s.accepted if scale is None else scale * s.drafts
    measured = s.windows / (s.windows - 1) * kept / (scaled * scaled)
    return _larger(measured, DRAFT_VARIANCE_FLOOR / s.drafts)


def _larger(x: float, y: float) -> float:
    """max(x, y), written so that it holds for arrays too."""
    return (x + y + abs(x - y)) / 2


def acceptance_llr(candidate: RatioSample, reference: RatioSample | float, drop: float) -> float:
    """log LR of "the candidate accepts (1 - drop) times the reference's tokens per draft"
    against "as many": `reference` is the serving revision's sample over the same span, or an
    expected value (known, no variance)."""
    against = reference.ratio if isinstance(reference, RatioSample) else reference
    # The candidate's variance relative to the reference's ratio, the scale of both hypotheses:
    # relative to its own, a candidate that accepts almost nothing would have a variance without
    # bound and never be judged (a drafter that accepted 0.008 tokens per draft against 3.0 was
    # left Pending on the CPU tier's real engines).
    vc = relative_variance(candidate, against)
    if isinstance(reference, RatioSample):
        vr = relative_variance(reference)
        theta = candidate.ratio / against
        df = (
            (vc + vr)
            * (vc + vr)
            / (vc * vc / (candidate.windows - 1) + vr * vr / (reference.windows - 1))
        )
    else:
        vr = 0.0 * vc
        theta = candidate.ratio / against
        df = candidate.windows - 1
    variance = (vc + vr) * (1 + SMALL_SAMPLE / df)
    return drop * (1 - drop / 2 - theta) / variance


def rate_llr(
    events: float,
    exposure: float,
    reference_events: float,
    reference_exposure: float,
    log: Callable[[float], float] = math.log,
) -> float:
    """log LR of "the candidate's rate is `RATE_RATIO` times the reference's" against "equal",
    given the events of both: each falls on the candidate with probability its share of the
    exposure (share * ratio / (share * ratio + 1 - share) when regressed)."""
    total = exposure + reference_exposure
    return events * math.log(RATE_RATIO) + (events + reference_events) * log(
        total / (RATE_RATIO * exposure + reference_exposure)
    )


def ceiling_llr(events: float, exposure: float) -> float:
    """log LR of "fails at `CEILING_BROKEN`" against "at `CEILING`", for `events` among
    `exposure` requests (a binomial SPRT)."""
    return events * math.log(CEILING_BROKEN / CEILING) + (exposure - events) * math.log(
        (1 - CEILING_BROKEN) / (1 - CEILING)
    )

"""Whole rollouts as they reach pdmtp's verdict, many at once (numpy): the evidence that its
false-rollback chance holds over every judgement a rollout makes, and how soon it catches a
regression (issue 50; docs/benchmarks.md, "The verdict's statistics, simulated").

The traffic is modelled as the verdict sees it, not as the test assumes it:

- requests arrive at each decode pod (Poisson), each of one class of the workload mix (its own
  per-token acceptance) and an output length drawn from the mix's range;
- MTP drafts k tokens a step and accepts a run of them (token i with the class's acceptance,
  until one is refused): a request of L tokens takes ceil(L / (1 + mean accepted)) steps, and
  its accepted tokens are drawn as the sum of that many steps' (a multinomial over 0..k,
  drawn exactly below `EXACT_STEPS` steps and by its normal approximation, same mean and
  variance, above: the spread that matters is between requests, not within one);
- a request runs for its steps (`Traffic.steps_per_window` a window), so its counts land in the
  window it started in and the next, in proportion: counters grow per scrape window, as vLLM's
  do;
- a failed pull (rate `failure_rate`) asks for KV, fails, and under vLLM's default policy fails
  the request: counted in requests and failed, no drafts; a decode-only request (rate
  `decode_only_rate`) is served from a recomputed prompt: drafts, not a pull.

The judgement at every scrape is the verdict's own (`pdmtp.core.verification.statistics`,
evaluated over arrays of rollouts; the precedence of `verdict.judge` written out for arrays), and
`judge_with_pdmtp` runs the real `judge` on a rollout's windows, so a test can prove the two
agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from pdmtp.core.promtext import Scrape
from pdmtp.core.verification import statistics as st
from pdmtp.core.verification.statistics import RatioSample
from pdmtp.core.verification.verdict import Outcome, Reference, Rules, evidence, judge, started
from pdmtp.core.windows import PodMetrics, Window

Array = NDArray[np.float64]
EXACT_STEPS = 30
"""A request's accepted tokens are drawn exactly below this many steps, by the central limit
theorem above (a sum of 30 or more bounded steps)."""
FAILED, PENDING, VERIFIED = -1, 0, 1
OUTCOMES = {Outcome.FAILED: FAILED, Outcome.PENDING: PENDING, Outcome.VERIFIED: VERIFIED}


@dataclass(frozen=True)
class Mix:
    """A workload: request classes (per-token acceptance, share of requests), output lengths."""

    name: str
    classes: tuple[tuple[float, float], ...]
    outputs: tuple[int, int]


MIXES = (
    Mix("0.55/0.85 half and half", ((0.55, 0.5), (0.85, 0.5)), (32, 512)),
    Mix("0.65/0.85 half and half", ((0.65, 0.5), (0.85, 0.5)), (32, 512)),
    Mix("one kind at 0.7", ((0.7, 1.0),), (32, 512)),
    Mix("short outputs, 0.55/0.85", ((0.55, 0.5), (0.85, 0.5)), (8, 32)),
)


@dataclass(frozen=True)
class Traffic:
    """How requests reach each revision's decode pods."""

    candidate_pods: int = 2
    reference_pods: int = 2
    per_window: float = 8.0
    """Requests per decode pod and scrape window (Poisson mean)."""
    steps_per_window: float = 300.0
    """Decode steps in one scrape window: 15 s at 50 ms a step (a 512-token request at low
    acceptance spans most of a window)."""


@dataclass(frozen=True)
class Counts:
    """What each (rollout, pod, window) counted: arrays of shape [rollouts, pods, windows]."""

    requests: Array
    failed: Array
    decode_only: Array
    drafts: Array
    accepted: Array


def draft_outcomes(p: float, k: int) -> NDArray[np.float64]:
    """P(a step accepts j of its k draft tokens), j = 0..k: a run until the first refusal."""
    return np.array([p**j * (1 - p) for j in range(k)] + [p**k])


def accepted_per_draft(p: float, k: int) -> float:
    return float(sum(p**i for i in range(1, k + 1)))


def scaled(p: float, k: int, factor: float) -> float:
    """The per-token acceptance whose accepted tokens per draft are `factor` times p's."""
    target, low, high = factor * accepted_per_draft(p, k), 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if accepted_per_draft(mid, k) < target else (low, mid)
    return (low + high) / 2


def revision(
    rng: np.random.Generator,
    rollouts: int,
    windows: int,
    mix: Mix,
    k: int,
    pods: int,
    traffic: Traffic,
    failure_rate: float = 0.0,
    decode_only_rate: float = 0.0,
    acceptance_factor: float = 1.0,
) -> Counts:
    """One revision's decode pods over `windows` scrape windows, in `rollouts` rollouts."""
    arrivals = rng.poisson(traffic.per_window * windows, size=(rollouts, pods))
    total = int(arrivals.sum())
    cell = np.repeat(np.arange(rollouts * pods), arrivals.ravel())
    at = rng.uniform(0, windows, size=total)
    shares = np.cumsum([share for _, share in mix.classes])
    kind = np.minimum(np.searchsorted(shares, rng.random(total), side="right"), len(shares) - 1)
    length = rng.integers(mix.outputs[0], mix.outputs[1] + 1, size=total)
    steps = np.zeros(total)
    accepted = np.zeros(total)
    for i, (p, _) in enumerate(mix.classes):
        mine = np.flatnonzero(kind == i)
        per_token = p if acceptance_factor == 1.0 else scaled(p, k, acceptance_factor)
        n = np.ceil(length[mine] / (1 + accepted_per_draft(per_token, k))).astype(np.int64)
        steps[mine] = n
        accepted[mine] = _accepted(rng, n, per_token, k)
    failed = rng.random(total) < failure_rate
    decode_only = ~failed & (rng.random(total) < decode_only_rate)
    steps[failed] = 0
    accepted[failed] = 0
    window = np.floor(at).astype(np.int64)
    duration = steps / traffic.steps_per_window
    spill = np.clip(at + duration - (window + 1), 0, None) / np.maximum(duration, 1e-12)
    cells = rollouts * pods * (windows + 1)
    base = cell * (windows + 1)

    def binned(weights: Array, spilled: bool) -> Array:
        now = weights * (1 - spill) if spilled else weights
        out = np.bincount(base + window, weights=now, minlength=cells)
        if spilled:
            out += np.bincount(base + window + 1, weights=weights * spill, minlength=cells)
        return out.reshape(rollouts, pods, windows + 1)[:, :, :windows]

    return Counts(
        requests=binned((~decode_only).astype(float), False),
        failed=binned(failed.astype(float), False),
        decode_only=binned(decode_only.astype(float), False),
        drafts=binned(steps, True),
        accepted=binned(accepted, True),
    )


def _accepted(rng: np.random.Generator, steps: NDArray[np.int64], p: float, k: int) -> Array:
    """Accepted tokens over each request's steps."""
    odds = draft_outcomes(p, k)
    values = np.arange(k + 1)
    mean = float(odds @ values)
    variance = float(odds @ values**2) - mean * mean
    out = np.zeros(len(steps))
    few = steps < EXACT_STEPS
    left, remaining, got = steps[few].copy(), 1.0, np.zeros(int(few.sum()))
    for j in range(k):  # a multinomial over 0..k, as a chain of binomials
        drawn = rng.binomial(left, min(odds[j] / remaining, 1.0)) if remaining > 0 else 0
        left = left - drawn
        got += j * drawn
        remaining -= odds[j]
    out[few] = got + k * left
    many = steps[~few]
    drawn = np.rint(many * mean + np.sqrt(many * variance) * rng.standard_normal(len(many)))
    out[~few] = np.clip(drawn, 0, k * many)
    return out


@dataclass(frozen=True)
class Cumulative:
    """A revision's evidence at each judgement: arrays of shape [rollouts, windows]."""

    requests: Array
    failed: Array
    decode_only: Array
    sample: RatioSample

    @property
    def exposure(self) -> Array:
        return self.requests + self.decode_only


def cumulative(c: Counts) -> Cumulative:
    """Each revision's sums after each window, over its pods (`statistics.ratio_sample`'s, with
    the lag terms within a pod)."""

    def upto(x: Array) -> Array:
        return np.cumsum(x.sum(axis=1), axis=1)

    a, d = c.accepted, c.drafts
    before_a = np.concatenate([np.zeros_like(a[:, :, :1]), a[:, :, :-1]], axis=2)
    before_d = np.concatenate([np.zeros_like(d[:, :, :1]), d[:, :, :-1]], axis=2)
    sample = RatioSample(
        windows=upto((d > 0).astype(float)),
        accepted=upto(a),
        drafts=upto(d),
        accepted_sq=upto(a * a),
        accepted_drafts=upto(a * d),
        drafts_sq=upto(d * d),
        lag_accepted=upto(a * before_a),
        lag_cross=upto(a * before_d + d * before_a),
        lag_drafts=upto(d * before_d),
    )
    return Cumulative(upto(c.requests), upto(c.failed), upto(c.decode_only), sample)


def decide(candidate: Cumulative, reference: Cumulative, rules: Rules) -> NDArray[np.int64]:
    """The verdict on the candidate after each window (FAILED, PENDING, VERIFIED), as
    `verdict.judge` reaches it with the serving revision as the reference (both draft alike)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        fault = _rate_fault(
            candidate.failed, candidate, reference, reference.failed, "failed", rules
        )
        fault |= _rate_fault(
            candidate.decode_only, candidate, reference, reference.decode_only, "decode_only", rules
        )
        c, r = candidate.sample, reference.sample
        llr = st.acceptance_llr(c, r, rules.smallest_regression)
        regressed = st.fail_at(rules.false_rollback * st.ALPHA_SHARES["acceptance"])
    reference_ready = (r.drafts >= rules.min_drafts) & (r.windows >= st.MIN_WINDOWS)
    candidate_ready = (c.drafts >= rules.min_drafts) & (c.windows >= st.MIN_WINDOWS)
    judged = reference_ready & candidate_ready
    out = np.where(judged & (llr >= regressed), FAILED, PENDING)
    out = np.where(judged & (llr <= st.pass_at()), VERIFIED, out)
    # No drafts on either side: nothing drafts, acceptance is not judged.
    out = np.where((r.drafts == 0) & (c.drafts == 0), VERIFIED, out)
    out = np.where(candidate.requests < rules.min_requests, PENDING, out)
    return np.where(fault, FAILED, out).astype(np.int64)


def _rate_fault(
    events: Array,
    candidate: Cumulative,
    reference: Cumulative,
    theirs: Array,
    test: str,
    rules: Rules,
) -> NDArray[np.bool_]:
    gross = (events >= st.GROSS_FAILURES) & (events >= candidate.exposure - events)
    threshold = st.fail_at(rules.false_rollback * st.ALPHA_SHARES[test])
    compared = st.rate_llr(events, candidate.exposure, theirs, reference.exposure, log=np.log)
    alone = (candidate.exposure > 0) & (st.ceiling_llr(events, candidate.exposure) >= threshold)
    tested = np.where(reference.exposure > 0, compared >= threshold, alone)
    return np.asarray(gross | tested)


def pod_metrics(c: Counts, rollout: int, pod: int, upto: int) -> PodMetrics:
    """One simulated pod's windows through window `upto`, as the scraper would hold them."""
    windows = tuple(
        Window(
            float(w),
            float(w + 1),
            requests=float(c.requests[rollout, pod, w]),
            failed=float(c.failed[rollout, pod, w]),
            decode_only=float(c.decode_only[rollout, pod, w]),
            drafts=float(c.drafts[rollout, pod, w]),
            accepted=float(c.accepted[rollout, pod, w]),
        )
        for w in range(upto + 1)
    )
    latest = Scrape(float(upto + 1), kv_pulled_requests=sum(w.requests for w in windows))
    return PodMetrics(latest, None, windows)


def judge_with_pdmtp(
    candidate: Counts, reference: Counts, rollout: int, upto: int, rules: Rules
) -> Outcome:
    """The real `judge` on one rollout's windows through `upto`."""
    mine = [pod_metrics(candidate, rollout, p, upto) for p in range(candidate.drafts.shape[1])]
    theirs = [pod_metrics(reference, rollout, p, upto) for p in range(reference.drafts.shape[1])]
    since = started(mine)
    return judge(evidence(mine), Reference(evidence(theirs, since, first=False)), rules).outcome


def first(mask: NDArray[np.bool_]) -> NDArray[np.int64]:
    """Per rollout, the first window where `mask` holds; a large number where it never does."""
    return np.where(mask.any(axis=1), mask.argmax(axis=1), np.iinfo(np.int64).max // 2)


@dataclass(frozen=True)
class Run:
    """One cell's rollouts: the candidate's verdict after each window and its requests by then."""

    outcome: NDArray[np.int64]
    requests: Array
    """The candidate's requests (pulled and decode-only) after each window."""

    def failed_within(self, requests: float) -> float:
        """The share of rollouts Failed at some judgement up to the one at which the candidate
        has served `requests` (a rollout of that many requests, judged at every scrape)."""
        last = (self.requests < requests).sum(axis=1)  # judgements before reaching it, then one
        return float((first(self.outcome == FAILED) <= last).mean())

    def caught(self) -> Array:
        """Per rollout, the candidate's requests when it was Failed, if before any Verified;
        infinity where it was never caught first."""
        failed, verified = first(self.outcome == FAILED), first(self.outcome == VERIFIED)
        windows = self.outcome.shape[1]
        at = np.take_along_axis(self.requests, np.minimum(failed, windows - 1)[:, None], 1)[:, 0]
        return np.where((failed < verified) & (failed < windows), at, np.inf)

    def verified_at(self) -> Array:
        """Per rollout, the candidate's requests when first Verified (infinity: never)."""
        verified = first(self.outcome == VERIFIED)
        windows = self.outcome.shape[1]
        at = np.take_along_axis(self.requests, np.minimum(verified, windows - 1)[:, None], 1)[:, 0]
        return np.where(verified < windows, at, np.inf)


def windows_for(requests: float, traffic: Traffic) -> int:
    """Scrape windows in which the candidate's pods serve `requests` on average."""
    return math.ceil(requests / (traffic.candidate_pods * traffic.per_window))


def run(
    rng: np.random.Generator,
    rollouts: int,
    requests: float,
    mix: Mix,
    k: int,
    rules: Rules,
    traffic: Traffic = Traffic(),
    background: float = 0.0,
    failure_rate: float | None = None,
    acceptance_factor: float = 1.0,
    batch: int = 250,
) -> Run:
    """`rollouts` rollouts of about `requests` candidate requests each, the reference serving
    beside the candidate with the same mix and the background failure and decode-only rate;
    the candidate fails pulls at `failure_rate` (the background where None) and accepts
    `acceptance_factor` times as many tokens per draft."""
    windows = windows_for(requests, traffic)
    outcomes, served = [], []
    for start in range(0, rollouts, batch):
        n = min(batch, rollouts - start)
        mine = revision(
            rng,
            n,
            windows,
            mix,
            k,
            traffic.candidate_pods,
            traffic,
            background if failure_rate is None else failure_rate,
            background,
            acceptance_factor,
        )
        theirs = revision(
            rng, n, windows, mix, k, traffic.reference_pods, traffic, background, background
        )
        c = cumulative(mine)
        outcomes.append(decide(c, cumulative(theirs), rules))
        served.append(c.exposure)
    return Run(np.concatenate(outcomes), np.concatenate(served))


def quantile(values: Sequence[float] | Array, q: float) -> float:
    return float(np.quantile(np.asarray(values, dtype=float), q))

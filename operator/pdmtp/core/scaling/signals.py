"""The autoscaler's signals, read off the engines' scrapes: per signal, the role's value, how many
Ready pods reported it, and the count it asks for (HPA's proportional rule, within a tolerance).

Default signals (their targets are in `pdmtp.api.autoscaling.AUTOSCALING_DEFAULTS`), and why:

- prefill: `waitingRequestsPerPod` (vllm:num_requests_waiting) and `queueTimeSeconds`
  (windowed mean of vllm:request_queue_time_seconds). A P/D prefill pod runs each prompt once
  and hands it on; its work is compute-bound, so when arrivals outrun it the first thing that grows
  is its queue, in proportion to the excess: the leading signal (Kthena scales on the same one).
  Queue time is the part of TTFT that more pods remove; TTFT itself also holds the prompt's own
  compute time, which depends on prompt length and not on pod count, so it is available
  (`timeToFirstTokenSeconds`) but not a default.
- decode: `kvCacheUsage` (vllm:kv_cache_usage_perc), `runningRequestsPerPod`
  (vllm:num_requests_running) and `interTokenLatencySeconds` (windowed mean of
  vllm:inter_token_latency_seconds). A decode pod holds every running request's KV for the whole
  generation: when the cache fills, vLLM preempts and recomputes, a latency cliff, so KV usage is
  its binding resource; running requests is its concurrency (the batch it steps), which sets its
  token rate; ITL is the latency a user feels. The ITL target must sit above an idle engine's
  ITL, or the signal asks for maxReplicas forever.

MTP-aware decode sizing: the `decodeTokensPerSecondPerPod` signal (decode, with MTP). With
speculative decoding a forward step of a running request emits `1 + a` tokens, `a` being the
measured acceptance length: accepted tokens per draft, the deltas of
vllm:spec_decode_num_accepted_tokens / vllm:spec_decode_num_drafts between two scrapes, over the
role's Ready pods. A step costs the same whatever is accepted (it verifies every drafted token),
so a pod's token capacity is proportional to `1 + a`. The target is the tokens per second a pod
sustains at the role's `expectedAcceptanceLength` (from a benchmark); the effective target is
`target * (1 + a_observed) / (1 + a_expected)`, and the observed value is the tokens the pods
emit per second (delta accepted + delta drafts, per pod). Equivalently it compares request-steps
per second (one draft per running request per step) with the pod's step capacity: the demand in
tokens is the users', the steps it takes depend on acceptance. At the same request rate a drop in
acceptance leaves the token rate where it is and shrinks the target, so the recommendation rises
by exactly `(1 + a_expected) / (1 + a_observed)`, at the next evaluation. Served tokens equal
the demand while the pods keep up; once they cannot, the queue, running and KV signals show the
excess (a saturated signal reads about its target, as CPU utilisation does for HPA).
The alternative, scaling the runningRequestsPerPod target by the same factor, was rejected: at
the same request rate the running count already rises by that factor (Little's law: requests
need more steps when fewer drafts are accepted, so they stay longer), so it would count the drop
twice and over-provision by the square. runningRequestsPerPod and kvCacheUsage stay unadjusted;
they react to a drop through Little's law on their own, and the largest vote wins.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum

from pdmtp.api.autoscaling import RoleAutoscaling, Signal
from pdmtp.core.promtext import HistogramTotals, Scrape

# Per-pod gauges: the role's value is their mean over the reporting pods.
_GAUGES: dict[Signal, Callable[[Scrape], float | None]] = {
    Signal.WAITING_PER_POD: lambda scrape: scrape.waiting,
    Signal.RUNNING_PER_POD: lambda scrape: scrape.running,
    Signal.KV_CACHE_USAGE: lambda scrape: scrape.kv_cache_usage,
}


# Histograms: the role's value is the mean of what was observed between two scrapes.
_WINDOWED: dict[Signal, Callable[[Scrape], HistogramTotals | None]] = {
    Signal.QUEUE_TIME: lambda scrape: scrape.queue_time,
    Signal.TIME_TO_FIRST_TOKEN: lambda scrape: scrape.time_to_first_token,
    Signal.INTER_TOKEN_LATENCY: lambda scrape: scrape.inter_token_latency,
}


@dataclass(frozen=True)
class PodObservation:
    """One engine pod as the scraper saw it: its two latest scrapes (for windowed means)."""

    name: str
    ready: bool
    latest: Scrape | None = None
    previous: Scrape | None = None


class Coverage(StrEnum):
    FULL = "full"
    """Every Ready pod reported."""
    PARTIAL = "partial"
    """Some, not all: may vote up, not down."""
    MISSING = "missing"
    """No Ready pod reported it (or there is no Ready pod): no vote, and no scale-down."""
    QUIET = "quiet"
    """Reported, but nothing happened in the window (no request finished): no vote."""


@dataclass(frozen=True)
class SignalReading:
    signal: Signal
    target: float
    """The target used (for decodeTokensPerSecondPerPod, after the MTP adjustment)."""
    value: float | None
    desired: int | None
    """The count this signal asks for; None when it does not vote."""
    coverage: Coverage
    reporting_pods: int
    ready_pods: int
    within_tolerance: bool = False


@dataclass(frozen=True)
class Acceptance:
    """MTP acceptance as measured over the window, and what it did to the decode's target."""

    expected: float
    observed: float | None
    """Accepted tokens per draft; None when no draft was made in the window."""
    capacity_factor: float
    """(1 + observed) / (1 + expected): the decode-tokens target is multiplied by this."""


def _spec_decode_deltas(
    fresh: Sequence[PodObservation],
) -> Iterator[tuple[float, float, float]]:
    """Per pod with two usable scrapes: accepted tokens, drafts, and the seconds between them."""
    for pod in fresh:
        latest, previous = pod.latest, pod.previous
        if latest is None or previous is None or previous.at >= latest.at:
            continue
        accepted = _counter_delta(latest.accepted_tokens, previous.accepted_tokens)
        drafts = _counter_delta(latest.drafts, previous.drafts)
        if accepted is not None and drafts is not None:
            yield accepted, drafts, latest.at - previous.at


def acceptance_of(rules: RoleAutoscaling, fresh: Sequence[PodObservation]) -> Acceptance | None:
    """Measured accepted tokens per draft over the window, and the capacity factor it implies."""
    expected = rules.expected_acceptance_length
    if expected is None:
        return None
    accepted = drafts = 0.0
    for accepted_delta, drafts_delta, _ in _spec_decode_deltas(fresh):
        accepted += accepted_delta
        drafts += drafts_delta
    if drafts <= 0:
        return Acceptance(expected, None, 1.0)
    observed = accepted / drafts
    return Acceptance(expected, observed, (1 + observed) / (1 + expected))


def _counter_delta(latest: float | None, previous: float | None) -> float | None:
    """Increase of a counter between two scrapes; a drop means the engine restarted."""
    if latest is None or previous is None:
        return None
    return latest - previous if latest >= previous else latest


def read_signal(
    signal: Signal,
    target: float,
    tolerance: float,
    acceptance: Acceptance | None,
    ready: int,
    fresh: Sequence[PodObservation],
    current: int,
) -> SignalReading:
    if signal is Signal.DECODE_TOKENS_PER_POD and acceptance is not None:
        target = target * acceptance.capacity_factor
    value, reporting = _observe(signal, fresh)
    if ready == 0 or reporting == 0:
        coverage = Coverage.MISSING
    elif reporting < ready:
        coverage = Coverage.PARTIAL
    elif value is None:
        coverage = Coverage.QUIET
    else:
        coverage = Coverage.FULL
    if value is None or coverage is Coverage.MISSING:
        return SignalReading(signal, target, value, None, coverage, reporting, ready)

    ratio = value / target
    within = abs(ratio - 1) <= tolerance
    # Proportional, as HPA, over the Ready pods when all of them reported; over only the pods
    # heard from when too few did (the silent ones are counted as idle, so a partial view asks
    # for less, never more; it cannot vote down anyway, see the hold). The epsilon keeps float
    # noise (3 * 0.1 / 0.1) from adding a pod.
    base = reporting if coverage is Coverage.PARTIAL else ready
    proportional = math.ceil(base * ratio - 1e-9)
    if within:
        desired = current
    elif ratio > 1:
        desired = max(current, proportional)
    else:
        desired = min(current, proportional)
    return SignalReading(signal, target, value, desired, coverage, reporting, ready, within)


def _observe(signal: Signal, fresh: Sequence[PodObservation]) -> tuple[float | None, int]:
    """(the role's value, how many pods reported it) over the fresh Ready pods."""
    gauge = _GAUGES.get(signal)
    if gauge is not None:
        values = [
            v for pod in fresh if pod.latest is not None and (v := gauge(pod.latest)) is not None
        ]
        return (sum(values) / len(values) if values else None), len(values)
    if signal is Signal.DECODE_TOKENS_PER_POD:
        return _decode_tokens_per_pod(fresh)
    histogram = _WINDOWED[signal]
    total = count = 0.0
    reporting = 0
    for pod in fresh:
        latest, previous = pod.latest, pod.previous
        if latest is None or previous is None or previous.at >= latest.at:
            continue
        now_totals, then_totals = histogram(latest), histogram(previous)
        if now_totals is None or then_totals is None:
            continue
        reporting += 1
        if now_totals.count >= then_totals.count:
            total += now_totals.sum - then_totals.sum
            count += now_totals.count - then_totals.count
        else:  # the engine restarted between the scrapes: all it has is since then
            total += now_totals.sum
            count += now_totals.count
    return (total / count if count > 0 else None), reporting


def _decode_tokens_per_pod(fresh: Sequence[PodObservation]) -> tuple[float | None, int]:
    """Mean tokens per second per pod (accepted + one per draft) between the two scrapes."""
    rates = [
        (accepted + drafts) / seconds for accepted, drafts, seconds in _spec_decode_deltas(fresh)
    ]
    if not rates:
        return None, 0
    # No token in the window (an idle decode): reported, but nothing to judge capacity by.
    return (sum(rates) / len(rates) if any(rates) else None), len(rates)

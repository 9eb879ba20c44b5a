"""Elastic P/D: how many prefill and decode pods the load asks for, decided as a pure function.

`evaluate(spec, pods, current, history, now)` takes spec.autoscaling as the API types it (its
defaults resolved by `pdmtp.api.autoscaling`, the one place they are written), the engines' own
metrics per pod (already parsed, see `pdmtp.core.promtext`), each pod's Ready flag, the replicas
each role has now, the recommendations and scale events of the last minutes and the time, and
returns per role the
desired replicas, the raw recommendation, the signal that decided, a reason a human can read and
every signal value it used, plus the history to hand back next time. No clock, no I/O: the caller
scrapes, stores the history and writes the replicas.

Per role, in this order (each step names itself in the reason when it changed the number):

1. Signals. Each configured signal gives a desired count the way HPA does,
   `ceil(ready * observed / target)` over the role's Ready pods, or exactly the current count when
   `observed / target` is within the tolerance band (as HPA's). A signal never votes
   against its own direction: above target it never asks for fewer pods than there are.
2. Recommendation: the largest vote, and the signal that cast it decides.
3. Missing data holds. A Ready pod without a fresh scrape (older than `staleAfterSeconds`) or
   without the metric makes its signal incomplete; an incomplete signal may still ask for more
   pods on what it has (counting the silent pods as idle, so it never over-asks), but the role is
   not scaled down until every Ready pod reports every configured signal again. A
   windowed signal with no request in the window is quiet, not missing: an idle role may shrink.
4. Stabilisation, as HPA's `behavior`: the count used is the lowest recommendation of the
   scale-up window (a short spike does not buy pods) and the highest of the scale-down window (a
   dip does not give them back).
5. Step limits, as HPA's `behavior` policies: at most +N pods or +P% (the larger) per period up,
   at most -N pods or -P% (the larger, and at least one pod) per period down, counted from the
   replicas the role had at the start of the period.
6. minReplicas / maxReplicas.

Then across roles, 7. the prefill:decode ratio band: when the two counts leave it, the nearest
pair inside it is taken, preferring to add pods rather than take any away (a role that wanted
fewer pods is left as it is when the other can rise instead).

Precedence when they disagree: min/max > ratio band > missing-data hold > step limits >
stabilisation. min/max wins over the band because they are the budget (GPUs) the user granted; a
band that no pair within min/max satisfies is reported in the reason (admission should refuse it).
The band wins over step limits and the hold, because it is the one invariant the issue promises
no decision leaves: a role may then move further than its step, or down on missing data when the
other role is at its max.

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
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction

from pdmtp.api.autoscaling import (
    EXTERNAL,
    AutoscalingSpec,
    RatioBand,
    RoleAutoscaling,
    Signal,
    exact,
)
from pdmtp.api.vocabulary import ENGINE_ROLES, EngineRole
from pdmtp.core.promtext import HistogramTotals, Scrape

__all__ = [
    "Acceptance",
    "Coverage",
    "Evaluation",
    "HistogramTotals",
    "PodObservation",
    "Recommendation",
    "RoleDecision",
    "RoleHistory",
    "ScaleEvent",
    "Scrape",
    "Signal",
    "SignalReading",
    "evaluate",
]


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


# ---------------------------------------------------------------------------------------------
# Inputs and outputs


@dataclass(frozen=True)
class PodObservation:
    """One engine pod as the scraper saw it: its two latest scrapes (for windowed means)."""

    name: str
    ready: bool
    latest: Scrape | None = None
    previous: Scrape | None = None


@dataclass(frozen=True)
class Recommendation:
    at: float
    replicas: int


@dataclass(frozen=True)
class ScaleEvent:
    at: float
    before: int
    after: int


@dataclass(frozen=True)
class RoleHistory:
    """What stabilisation and step limits remember; `evaluate` returns it pruned and updated."""

    recommendations: tuple[Recommendation, ...] = ()
    scale_events: tuple[ScaleEvent, ...] = ()


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


@dataclass(frozen=True)
class RoleDecision:
    role: EngineRole
    current: int
    recommendation: int
    """The raw recommendation (largest vote, after the missing-data hold), before stabilisation."""
    desired: int
    deciding_signal: Signal | None
    reason: str
    readings: tuple[SignalReading, ...]
    held_for_missing_data: bool
    acceptance: Acceptance | None = None

    @property
    def changed(self) -> bool:
        """A decision worth an event: the count moves."""
        return self.desired != self.current


@dataclass(frozen=True)
class Evaluation:
    roles: Mapping[EngineRole, RoleDecision]
    history: Mapping[EngineRole, RoleHistory]
    """Persist this once the desired replicas are written; pass it back next time."""
    ratio_note: str | None = None


# ---------------------------------------------------------------------------------------------
# The decision

UNREACHABLE = "unreachable within min/max replicas: min/max win"


def evaluate(
    spec: AutoscalingSpec,
    pods: Mapping[EngineRole, Sequence[PodObservation]],
    current: Mapping[EngineRole, int],
    history: Mapping[EngineRole, RoleHistory],
    now: float,
    external: Mapping[EngineRole, int | None] | None = None,
) -> Evaluation:
    """Desired replicas per role, with the reason, from metrics, spec, history and `now`.

    A role without spec.autoscaling keeps its `current` count (the band still counts it).
    `external` is the count an outside scaler (an HPA through the role's scale endpoint) set for
    an External role: it replaces that role's signals, stabilisation and step limits (the HPA has
    its own), and min/max and the ratio band still apply."""
    asked = external or {}
    staged = {role: _stage(role, spec, pods, current, history, now, asked) for role in ENGINE_ROLES}
    prefill, decode = staged["prefill"].desired, staged["decode"].desired
    ratio_note = None
    if spec.ratio is not None:
        bounds = {role: _bounds(spec.role(role), current[role]) for role in ENGINE_ROLES}
        prefill, decode, ratio_note = _keep_ratio(
            spec.ratio, prefill, decode, bounds["prefill"], bounds["decode"]
        )
    final = {"prefill": prefill, "decode": decode}
    decisions = {role: staged[role].finish(final[role], ratio_note) for role in ENGINE_ROLES}
    return Evaluation(
        decisions,
        {
            role: _remember(spec.role(role), history[role], decisions[role], now)
            for role in ENGINE_ROLES
        },
        ratio_note,
    )


def _stage(
    role: EngineRole,
    spec: AutoscalingSpec,
    pods: Mapping[EngineRole, Sequence[PodObservation]],
    current: Mapping[EngineRole, int],
    history: Mapping[EngineRole, RoleHistory],
    now: float,
    external: Mapping[EngineRole, int | None],
) -> _Staged:
    scaling, count = spec.role(role), current[role]
    if scaling is None:
        return _Staged(role, count, count, count, None, (), False, None, ("not autoscaled",))
    asked = external.get(role)
    if scaling.source == EXTERNAL and asked is not None:
        return _external_role(role, scaling, count, asked)
    return _decide_role(role, scaling, spec, pods[role], count, history[role], now)


def _bounds(scaling: RoleAutoscaling | None, current: int) -> tuple[int, int]:
    """A role's min/max replicas; a role without autoscaling stays at its count."""
    return (current, current) if scaling is None else (scaling.min_replicas, scaling.max_replicas)


@dataclass(frozen=True)
class _Staged:
    """A role's decision before the ratio band is applied."""

    role: EngineRole
    current: int
    recommendation: int
    desired: int
    deciding: SignalReading | None
    readings: tuple[SignalReading, ...]
    held: bool
    acceptance: Acceptance | None
    steps: tuple[str, ...]

    def finish(self, desired: int, ratio_note: str | None) -> RoleDecision:
        steps = list(self.steps)
        if desired != self.desired and ratio_note is not None:
            steps.append(f"{ratio_note}: {self.desired} -> {desired}")
        elif ratio_note is not None and ratio_note.endswith(UNREACHABLE):
            steps.append(ratio_note)
        if desired > self.current:
            head = f"scale up {self.current} -> {desired}"
        elif desired < self.current:
            head = f"scale down {self.current} -> {desired}"
        else:
            head = f"hold at {desired}"
        return RoleDecision(
            role=self.role,
            current=self.current,
            recommendation=self.recommendation,
            desired=desired,
            deciding_signal=None if self.deciding is None else self.deciding.signal,
            reason=f"{self.role} {head}: " + "; ".join(steps),
            readings=self.readings,
            held_for_missing_data=self.held,
            acceptance=self.acceptance,
        )


def _decide_role(
    role: EngineRole,
    rules: RoleAutoscaling,
    spec: AutoscalingSpec,
    pods: Sequence[PodObservation],
    current: int,
    history: RoleHistory,
    now: float,
) -> _Staged:
    ready = [pod for pod in pods if pod.ready]
    fresh = [
        pod
        for pod in ready
        if pod.latest is not None and pod.latest.at >= now - spec.stale_after_seconds
    ]
    acceptance = _acceptance(rules, fresh)
    tolerance = rules.effective_tolerance()
    readings = tuple(
        _read(signal, target, tolerance, acceptance, len(ready), fresh, current)
        for signal, target in _ordered(rules.signal_targets(role))
    )
    steps: list[str] = []

    votes = [reading for reading in readings if reading.desired is not None]
    deciding = max(votes, key=_vote_strength, default=None)
    recommendation = current if deciding is None or deciding.desired is None else deciding.desired
    steps.append(_describe_vote(deciding, readings, acceptance))

    incomplete = [r for r in readings if r.coverage in (Coverage.PARTIAL, Coverage.MISSING)]
    held = bool(incomplete) and recommendation < current
    if held:
        recommendation = current
        missing = ", ".join(
            f"{r.signal} ({r.reporting_pods}/{r.ready_pods} Ready pods)" for r in incomplete
        )
        steps.append(f"no scale-down on missing or stale metrics: {missing}")

    stabilised = _stabilise(recommendation, current, history, rules, now)
    if stabilised != recommendation:
        up = stabilised < recommendation
        window = rules.scale_up_rules() if up else rules.scale_down_rules()
        direction = "up" if up else "down"
        steps.append(
            f"stabilised to {stabilised} over the {window.stabilization_window_seconds}s "
            f"scale-{direction} window"
        )
    limited = _limit_step(stabilised, current, history, rules, now)
    if limited != stabilised:
        direction = "up" if stabilised > current else "down"
        steps.append(f"scale-{direction} step limit allows {limited}")
    clamped = min(max(limited, rules.min_replicas), rules.max_replicas)
    if clamped != limited:
        bound = "minReplicas" if clamped == rules.min_replicas else "maxReplicas"
        steps.append(f"{bound} {clamped}")
    return _Staged(
        role, current, recommendation, clamped, deciding, readings, held, acceptance, tuple(steps)
    )


def _external_role(role: EngineRole, rules: RoleAutoscaling, current: int, asked: int) -> _Staged:
    steps = [f"set to {asked} through its scale endpoint"]
    clamped = min(max(asked, rules.min_replicas), rules.max_replicas)
    if clamped != asked:
        bound = "minReplicas" if clamped == rules.min_replicas else "maxReplicas"
        steps.append(f"{bound} {clamped}")
    return _Staged(role, current, asked, clamped, None, (), False, None, tuple(steps))


def _ordered(targets: Mapping[Signal, float]) -> list[tuple[Signal, float]]:
    """Signals in the enum's order, so reasons and ties do not depend on the mapping's order."""
    return [(signal, targets[signal]) for signal in Signal if signal in targets]


def _vote_strength(reading: SignalReading) -> tuple[int, float]:
    """Largest desired count wins; among equals, the signal furthest over its target."""
    ratio = 0.0 if reading.value is None else reading.value / reading.target
    return (reading.desired or 0, ratio)


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


def _acceptance(rules: RoleAutoscaling, fresh: Sequence[PodObservation]) -> Acceptance | None:
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


def _read(
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


def _describe_vote(
    deciding: SignalReading | None,
    readings: Sequence[SignalReading],
    acceptance: Acceptance | None,
) -> str:
    if not readings:
        return "no signal configured"
    if deciding is None or deciding.value is None:
        return "no signal voted (" + ", ".join(f"{r.signal} {r.coverage}" for r in readings) + ")"
    text = f"{deciding.signal} {deciding.value:.3g} vs target {deciding.target:.3g}"
    if deciding.signal is Signal.DECODE_TOKENS_PER_POD and acceptance is not None:
        if acceptance.observed is None:
            text += " (no MTP drafts in the window: expected acceptance assumed)"
        else:
            text += (
                f" (target x{acceptance.capacity_factor:.2f} for MTP acceptance "
                f"{acceptance.observed:.2f} vs expected {acceptance.expected:.2f})"
            )
    if deciding.within_tolerance:
        return text + " is within tolerance"
    return text + f" wants {deciding.desired}"


def _stabilise(
    recommendation: int, current: int, history: RoleHistory, rules: RoleAutoscaling, now: float
) -> int:
    """HPA's stabilisation: rise to the lowest recommendation of the scale-up window, fall only
    to the highest of the scale-down window."""
    up, down = rules.scale_up_rules(), rules.scale_down_rules()
    lowest_recent = highest_recent = recommendation
    for past in history.recommendations:
        # Inclusive: a change needs every recommendation of the whole window behind it.
        if past.at >= now - up.stabilization_window_seconds:
            lowest_recent = min(lowest_recent, past.replicas)
        if past.at >= now - down.stabilization_window_seconds:
            highest_recent = max(highest_recent, past.replicas)
    if current < lowest_recent:
        return lowest_recent
    if current > highest_recent:
        return highest_recent
    return current


def _limit_step(
    stabilised: int, current: int, history: RoleHistory, rules: RoleAutoscaling, now: float
) -> int:
    """HPA-style step limits, counted from the replicas at the start of the period."""
    up, down = rules.scale_up_rules(), rules.scale_down_rules()
    if stabilised > current:
        start = current - _net_change(history, up.period_seconds, now)
        limits = []
        if up.max_pods is not None:
            limits.append(start + up.max_pods)
        if up.max_percent is not None:
            limits.append(math.ceil(Fraction(start * (100 + up.max_percent), 100)))
        if not limits:
            return stabilised
        # A period already used up holds the count; it never turns a scale-up into a scale-down.
        return min(stabilised, max(max(limits), current))
    if stabilised < current:
        start = current - _net_change(history, down.period_seconds, now)
        limits = []
        if down.max_pods is not None:
            limits.append(start - down.max_pods)
        if down.max_percent is not None:
            keep = math.ceil(Fraction(start * (100 - down.max_percent), 100))
            limits.append(min(keep, start - 1))  # a small role still loses one pod a period
        if not limits:
            return stabilised
        return max(stabilised, min(min(limits), current))
    return stabilised


def _net_change(history: RoleHistory, period: int, now: float) -> int:
    return sum(e.after - e.before for e in history.scale_events if e.at > now - period)


def _keep_ratio(
    band: RatioBand,
    prefill: int,
    decode: int,
    prefill_bounds: tuple[int, int],
    decode_bounds: tuple[int, int],
) -> tuple[int, int, str | None]:
    """The pair within the band and both roles' min/max nearest to (prefill, decode).

    Nearest means: fewest pods taken away from what the roles want, then fewest added, then the
    decode count closest to its own. None inside the band: min/max win and the note says so.
    """
    low, high = exact(band.min), exact(band.max)
    label = f"prefill:decode band [{band.min:g}, {band.max:g}]"
    if low <= Fraction(prefill, decode) <= high:
        return prefill, decode, None
    best: tuple[tuple[int, int, int], int, int] | None = None
    (prefill_min, prefill_max), (decode_min, decode_max) = prefill_bounds, decode_bounds
    # Only decode counts for which some prefill count in [min, max] fits the band.
    first = max(decode_min, math.ceil(prefill_min / high))
    last = min(decode_max, math.floor(prefill_max / low))
    for candidate_decode in range(first, last + 1):
        lowest = max(prefill_min, math.ceil(low * candidate_decode))
        highest = min(prefill_max, math.floor(high * candidate_decode))
        if lowest > highest:
            continue
        candidate_prefill = min(max(prefill, lowest), highest)
        taken = max(0, prefill - candidate_prefill) + max(0, decode - candidate_decode)
        added = max(0, candidate_prefill - prefill) + max(0, candidate_decode - decode)
        key = (taken, added, abs(candidate_decode - decode))
        if best is None or key < best[0]:
            best = (key, candidate_prefill, candidate_decode)
    if best is None:
        return prefill, decode, f"{label} {UNREACHABLE}"
    return best[1], best[2], label


def _remember(
    scaling: RoleAutoscaling | None, past: RoleHistory, decision: RoleDecision, now: float
) -> RoleHistory:
    """The history with this decision added and what no window or period still needs dropped."""
    if scaling is None:
        return RoleHistory()
    up, down = scaling.scale_up_rules(), scaling.scale_down_rules()
    window = max(up.stabilization_window_seconds, down.stabilization_window_seconds)
    period = max(up.period_seconds, down.period_seconds)
    recommendations = tuple(r for r in past.recommendations if r.at > now - window)
    events = tuple(e for e in past.scale_events if e.at > now - period)
    if decision.changed:
        events += (ScaleEvent(now, decision.current, decision.desired),)
    return RoleHistory((*recommendations, Recommendation(now, decision.recommendation)), events)

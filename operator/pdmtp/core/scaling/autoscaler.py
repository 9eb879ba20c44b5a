"""Elastic P/D: how many prefill and decode pods the load asks for, decided as a pure function.

`evaluate(spec, pods, current, history, now)` takes spec.autoscaling as the API types it (its
defaults resolved by `pdmtp.api.autoscaling`, the one place they are written), the engines' own
metrics per pod (already parsed, see `pdmtp.core.promtext`), each pod's Ready flag, the replicas
each role has now, the recommendations and scale events of the last minutes and the time, and
returns per role the desired replicas, the raw recommendation, the signal that decided, a reason
a human can read and every signal value it used, plus the history to hand back next time. No
clock, no I/O: the caller scrapes, stores the history and writes the replicas.

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

This module orders the steps and writes the reason; the signals are read in `signals` (step 1),
stabilisation and step limits are `behavior` (4, 5), the band is `ratio` (7).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pdmtp.api.autoscaling import (
    EXTERNAL,
    AutoscalingSpec,
    RoleAutoscaling,
    Signal,
)
from pdmtp.api.vocabulary import ENGINE_ROLES, EngineRole
from pdmtp.core.promtext import HistogramTotals, Scrape
from pdmtp.core.scaling.behavior import (
    Recommendation,
    RoleHistory,
    ScaleEvent,
    limit_step,
    remember,
    stabilise,
)
from pdmtp.core.scaling.ratio import UNREACHABLE, keep_ratio
from pdmtp.core.scaling.signals import (
    Acceptance,
    Coverage,
    PodObservation,
    SignalReading,
    acceptance_of,
    read_signal,
)

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


# ---------------------------------------------------------------------------------------------
# Outputs (the inputs are `signals.PodObservation` and `behavior.RoleHistory`)


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
        prefill, decode, ratio_note = keep_ratio(
            spec.ratio, prefill, decode, bounds["prefill"], bounds["decode"]
        )
    final = {"prefill": prefill, "decode": decode}
    decisions = {role: staged[role].finish(final[role], ratio_note) for role in ENGINE_ROLES}
    return Evaluation(
        decisions,
        {
            role: remember(
                spec.role(role),
                history[role],
                now,
                decisions[role].recommendation,
                decisions[role].current,
                decisions[role].desired,
            )
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
    acceptance = acceptance_of(rules, fresh)
    tolerance = rules.effective_tolerance()
    readings = tuple(
        read_signal(signal, target, tolerance, acceptance, len(ready), fresh, current)
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

    stabilised = stabilise(recommendation, current, history, rules, now)
    if stabilised != recommendation:
        up = stabilised < recommendation
        window = rules.scale_up_rules() if up else rules.scale_down_rules()
        direction = "up" if up else "down"
        steps.append(
            f"stabilised to {stabilised} over the {window.stabilization_window_seconds}s "
            f"scale-{direction} window"
        )
    limited = limit_step(stabilised, current, history, rules, now)
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

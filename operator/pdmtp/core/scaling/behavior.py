"""HPA's `behavior`, for the autoscaler: stabilisation windows and step limits per period, and
the history they need (recommendations and scale events), pruned to what a window or a period
still covers. The history lives in the status, so a restarted operator resumes its windows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from pdmtp.api.autoscaling import RoleAutoscaling


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


def stabilise(
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


def limit_step(
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


def remember(
    scaling: RoleAutoscaling | None,
    past: RoleHistory,
    now: float,
    recommendation: int,
    current: int,
    desired: int,
) -> RoleHistory:
    """The history with this evaluation added (its raw recommendation, and the move from
    `current` to `desired` if any) and what no window or period still needs dropped."""
    if scaling is None:
        return RoleHistory()
    up, down = scaling.scale_up_rules(), scaling.scale_down_rules()
    window = max(up.stabilization_window_seconds, down.stabilization_window_seconds)
    period = max(up.period_seconds, down.period_seconds)
    recommendations = tuple(r for r in past.recommendations if r.at > now - window)
    events = tuple(e for e in past.scale_events if e.at > now - period)
    if desired != current:
        events += (ScaleEvent(now, current, desired),)
    return RoleHistory((*recommendations, Recommendation(now, recommendation)), events)

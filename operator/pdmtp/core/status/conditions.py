"""metav1.Condition bookkeeping: one setter, tested clause by clause.

lastTransitionTime moves only when status flips; reason, message and observedGeneration follow
every update; conditions of types pdmtp does not own are kept as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from pdmtp.api.reasons import CONDITION_TYPES
from pdmtp.api.status import Condition

Status = Literal["True", "False", "Unknown"]


@dataclass(frozen=True)
class ConditionUpdate:
    type: str
    status: Status
    reason: str
    message: str


@dataclass(frozen=True)
class Transition:
    """A condition whose status flipped (or appeared): worth an event."""

    type: str
    old: str | None
    new: str
    reason: str
    message: str


def parse_conditions(raw: Sequence[Mapping[str, Any]]) -> list[Condition]:
    """Conditions as stored; one that does not parse (hand-edited, say) is dropped, not fatal."""
    parsed = []
    for c in raw:
        try:
            parsed.append(Condition.model_validate(c))
        except ValidationError:
            continue
    return parsed


def set_conditions(
    current: Sequence[Condition],
    updates: Sequence[ConditionUpdate],
    generation: int | None,
    now: str,
) -> tuple[list[Condition], list[Transition]]:
    """The new condition list (in CONDITION_TYPES order, others kept) and what flipped."""
    by_type = {c.type: c for c in current}
    transitions = []
    for u in updates:
        old = by_type.get(u.type)
        flipped = old is None or old.status != u.status
        by_type[u.type] = Condition(
            type=u.type,
            status=u.status,
            observed_generation=generation,
            last_transition_time=now if old is None or flipped else old.last_transition_time,
            reason=u.reason,
            message=u.message,
        )
        if flipped:
            was = None if old is None else old.status
            transitions.append(Transition(u.type, was, u.status, u.reason, u.message))
    order: list[str] = [t for t in CONDITION_TYPES if t in by_type]
    order += sorted(t for t in by_type if t not in CONDITION_TYPES)
    return [by_type[t] for t in order], transitions


def find(conditions: Sequence[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)

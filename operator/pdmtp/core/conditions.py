"""metav1.Condition bookkeeping: one setter, tested clause by clause.

lastTransitionTime moves only when status flips; reason, message and observedGeneration follow
every update.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pdmtp.core.reasons import CONDITION_TYPES

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


def set_conditions(
    current: Sequence[dict[str, Any]],
    updates: Sequence[ConditionUpdate],
    generation: int | None,
    now: str,
) -> tuple[list[dict[str, Any]], list[Transition]]:
    """The new condition list (in CONDITION_TYPES order, others kept) and what flipped."""
    by_type = {c["type"]: dict(c) for c in current}
    transitions = []
    for u in updates:
        old = by_type.get(u.type)
        flipped = old is None or old.get("status") != u.status
        condition: dict[str, Any] = {
            "type": u.type,
            "status": u.status,
            "observedGeneration": generation,
            "lastTransitionTime": now if flipped or old is None else old["lastTransitionTime"],
            "reason": u.reason,
            "message": u.message,
        }
        if generation is None:
            del condition["observedGeneration"]
        by_type[u.type] = condition
        if flipped:
            transitions.append(
                Transition(
                    u.type,
                    None if old is None else old.get("status"),
                    u.status,
                    u.reason,
                    u.message,
                )
            )
    order = [t for t in CONDITION_TYPES if t in by_type]
    order += sorted(t for t in by_type if t not in CONDITION_TYPES)
    return [by_type[t] for t in order], transitions


def find(conditions: Sequence[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)

"""What a reconcile reports once the shell has applied its actions: the status (built in one pass
from the context and the findings, `builder.build`), whether it changed, and the events. Pure.

It comes after the writes because the status and the events say what the API server did with
them: a refused write shows in Progressing, and no event claims a write that was refused or never
sent.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pdmtp.api.status import PDDeploymentStatus
from pdmtp.core.actions import Action, Event, Rejection
from pdmtp.core.context import Context
from pdmtp.core.objects import Obj
from pdmtp.core.status.builder import Findings, as_dict, build
from pdmtp.core.status.conditions import Transition
from pdmtp.core.status.events import (
    action_events,
    condition_events,
    revision_events,
    rollout_events,
    stall_events,
    template_events,
)


@dataclass(frozen=True)
class Report:
    """The status a reconcile stands for, as the API's model and as written, and its events."""

    status: PDDeploymentStatus
    written: dict[str, Any]
    """`status` as the shell writes it (camelCase, unset fields left out)."""
    status_changed: bool
    """`written` differs from the stored status: the shell writes it (once)."""
    events: tuple[Event, ...]


def report(
    ctx: Context,
    found: Findings,
    actions: Sequence[Action],
    refused: Sequence[Rejection] = (),
    unapplied: Collection[str] = (),
) -> Report:
    """`refused` are the writes the API server refused (the status says so), `unapplied` the
    keys of actions never sent or refused as stale (the shell stops a step at its first refusal).
    No event claims any of them."""
    new, transitions = build(ctx, found, refused)
    keys = {r.key for r in refused} | set(unapplied)
    old = ctx.old
    events = [
        *rollout_events(found.steering),
        *template_events(old.template_rolls or (), found.template_rolls),
        *revision_events(found.step, found.states, found.retired, found.revision_keys, keys),
        *action_events(actions, keys),
        *condition_events(transitions, old.conditions, new.conditions),
        *stall_events(old.waiting_for, new.waiting_for),
        *(found.scaling.events if found.scaling is not None else ()),
    ]
    return _report(new, ctx.raw_old, events)


def unusable_report(
    refused: tuple[PDDeploymentStatus, list[Transition]],
    old: PDDeploymentStatus,
    raw_status: Obj,
) -> Report:
    """A spec that cannot be rolled out: its status says why (`builder.unusable`); the only
    events are its conditions' flips."""
    new, transitions = refused
    return _report(new, raw_status, condition_events(transitions, old.conditions, new.conditions))


def _report(new: PDDeploymentStatus, stored: Obj, events: Sequence[Event]) -> Report:
    written = as_dict(new)
    return Report(new, written, written != _without_none(stored), tuple(events))


def _without_none(data: Any) -> Any:
    """The stored status as the writer would have written it (unset fields left out)."""
    if isinstance(data, Mapping):
        return {k: _without_none(val) for k, val in data.items() if val is not None}
    if isinstance(data, list):
        return [_without_none(x) for x in data]
    return data

"""Which events a reconcile posts: condition transitions, and what its actions did.

Events are posted after the status write, and only for actions the shell reports as done.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from pdmtp.api import reasons
from pdmtp.core.actions import Action, Apply, Event, Scale
from pdmtp.core.conditions import Transition
from pdmtp.core.observe import format_time
from pdmtp.core.planner import RevisionState, Step


def transition_event(t: Transition) -> Event:
    """A condition flipped: a Warning when it went the bad way."""
    bad = (t.type == reasons.DEGRADED and t.new == "True") or (
        t.type in (reasons.CONFIG_COMPATIBLE, reasons.AVAILABLE) and t.new == "False"
    )
    return Event("Warning" if bad else "Normal", t.reason, f"{t.type}={t.new}: {t.message}")


def revision_events(
    step: Step, states: Sequence[RevisionState], retired: Collection[str]
) -> list[Event]:
    """A revision lost its traffic, or was retired (its Deployments deleted by this step)."""
    before = {s.revision: s for s in states}
    events = []
    for p in step.revisions:
        state = before.get(p.revision)
        if p.revision in retired:
            events.append(
                Event(
                    "Normal",
                    reasons.REVISION_RETIRED,
                    f"Retired revision {p.revision}: its drain is over",
                )
            )
        elif p.drain_until is not None and state is not None and not state.draining:
            events.append(
                Event(
                    "Normal",
                    reasons.TRAFFIC_STOPPED,
                    f"Stopped routing to revision {p.revision}; its pods drain "
                    f"until {format_time(p.drain_until)}",
                )
            )
    return events


def action_events(actions: Sequence[Action]) -> list[Event]:
    """Children created and old revisions scaled."""
    events = []
    for a in actions:
        if isinstance(a, Apply) and not a.exists:
            events.append(Event("Normal", reasons.CREATED, f"Created {a.key}"))
        elif isinstance(a, Scale):
            events.append(
                Event(
                    "Normal",
                    reasons.SCALED,
                    f"Scaled Deployment/{a.name} from {a.was} to {a.replicas}",
                )
            )
    return events

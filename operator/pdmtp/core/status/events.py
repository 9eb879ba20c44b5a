"""Which events a reconcile posts: condition transitions, and what its actions did.

Events are posted after the status write, and only for actions the API server accepted: an event
never claims a write that was refused.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from pdmtp.api import reasons
from pdmtp.api import vocabulary as v
from pdmtp.api.status import Condition, TemplateRollStatus, WaitStatus
from pdmtp.core.actions import Action, Annotate, Apply, Delete, Event, Scale
from pdmtp.core.objects import describe, format_time
from pdmtp.core.revision_state import RevisionState
from pdmtp.core.rollout.planner import Step
from pdmtp.core.rollout.steering import Steering
from pdmtp.core.status.conditions import Transition
from pdmtp.core.verification.templates import TemplateRoll


def transition_event(t: Transition) -> Event:
    """A condition flipped: a Warning when it went the bad way."""
    bad = (
        (t.type == reasons.DEGRADED and t.new == "True")
        or (t.type in (reasons.CONFIG_COMPATIBLE, reasons.AVAILABLE) and t.new == "False")
        or t.reason in reasons.WARNING_REASONS
    )
    return Event("Warning" if bad else "Normal", t.reason, f"{t.type}={t.new}: {t.message}")


def _news(was: Condition, now: Condition) -> bool:
    if now.type == reasons.VERIFIED:
        return was.reason != now.reason
    return (was.reason, was.message) != (now.reason, now.message)


def condition_events(
    transitions: Sequence[Transition], old: Sequence[Condition], new: Sequence[Condition]
) -> list[Event]:
    """Transitions, and a warning condition whose reason or message changed without a flip (a
    refusal that moved on to another child is news; the same refusal again is not). Verified's
    message carries the evidence, which moves at every scrape: only its reason is news."""
    events = [transition_event(t) for t in transitions]
    flipped = {t.type for t in transitions}
    before = {c.type: c for c in old}
    for c in new:
        was = before.get(c.type)
        if c.type in flipped or c.reason not in reasons.WARNING_REASONS or was is None:
            continue
        if _news(was, c):
            events.append(Event("Warning", c.reason, f"{c.type}={c.status}: {c.message}"))
    return events


def stall_events(old: Sequence[WaitStatus] | None, new: Sequence[WaitStatus] | None) -> list[Event]:
    """A Warning when the unfinished step starts waiting on something stuck it did not wait on
    at the last status write (status.waitingFor, old against new): each (object, reason) is posted
    when it appears, not at every reconcile, and again only after it cleared."""
    before = {(w.object, w.reason) for w in old or () if w.stuck}
    fresh = [w for w in new or () if w.stuck and (w.object, w.reason) not in before]
    if not fresh:
        return []
    return [Event("Warning", reasons.STALLED, f"Waiting for {describe(fresh)}")]


def rollout_events(steering: Steering) -> list[Event]:
    """A rollback decided, a canary promoted."""
    events = []
    if steering.new_failure and steering.rolling_back:
        events.append(
            Event(
                "Warning",
                reasons.ROLLBACK_STARTED,
                f"Rolling back from {steering.failed_revision} to {steering.rollback_revision}: "
                f"{steering.failure}",
            )
        )
    if steering.promoted:
        events.append(
            Event("Normal", reasons.PROMOTED, f"Promoted revision {steering.spec_revision}")
        )
    if steering.new_waiver:
        events.append(
            Event(
                "Warning",
                reasons.VERDICT_WAIVED,
                f"Revision {steering.spec_revision}: {steering.verdict_waived}",
            )
        )
    return events


def revision_events(
    step: Step,
    states: Sequence[RevisionState],
    retired: Collection[str],
    keys: Mapping[str, Collection[str]],
    refused: Collection[str],
) -> list[Event]:
    """A revision lost its traffic, or was retired (its Deployments deleted by this step); not
    when one of that revision's writes was refused."""
    before = {s.revision: s for s in states}
    events = []
    for p in step.revisions:
        if set(keys.get(p.revision, ())) & set(refused):
            continue
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
                    f"Stopped routing to revision {p.revision}; its pods drain until "
                    f"{format_time(p.drain_until)} at the earliest (drainSeconds from when its "
                    "last router pod stops serving)",
                )
            )
    return events


def action_events(actions: Sequence[Action], refused: Collection[str]) -> list[Event]:
    """Children created, updated and scaled, for the writes the API server accepted."""
    events = []
    for a in actions:
        if a.key in refused:
            continue
        if isinstance(a, Apply) and not a.exists:
            events.append(Event("Normal", reasons.CREATED, f"Created {a.key}"))
        elif isinstance(a, Apply):
            fields = ", ".join(a.drift[:5]) + (" ..." if len(a.drift) > 5 else "")
            events.append(Event("Normal", reasons.UPDATED, f"Updated {a.key}: {fields}"))
        elif isinstance(a, Annotate) and a.leaving and a.annotations.get(v.ANNOTATION_LEAVING):
            events.append(
                Event(
                    "Normal",
                    reasons.POD_LEAVING,
                    f"Pod/{a.name} leaves its routers before the scale-down removes it",
                )
            )
        elif isinstance(a, Delete) and a.kind == v.POD_GROUP_KIND and a.why:
            events.append(Event("Normal", reasons.GROUP_REMOVED, f"PodGroup/{a.name}: {a.why}"))
        elif isinstance(a, Scale):
            events.append(
                Event(
                    "Normal",
                    reasons.SCALED,
                    f"Scaled Deployment/{a.name} from {a.was} to {a.replicas}",
                )
            )
        if isinstance(a, Annotate) and (why := a.annotations.get(v.ANNOTATION_REPLACE)):
            events.append(
                Event(
                    "Warning",
                    reasons.REPLACING_POD,
                    f"Replacing Pod/{a.name}: {why}; its replacement is listed before it leaves",
                )
            )
    return events


def template_events(old: Sequence[TemplateRollStatus], new: Sequence[TemplateRoll]) -> list[Event]:
    """A role-local roll held, Verified, waived or gone back: once, when it reaches the phase."""
    before = {(r.revision, r.role, r.template): r.phase for r in old}
    events = []
    for roll in new:
        was = before.get((roll.revision, roll.role, roll.template))
        if was == roll.phase:
            continue
        where = f"Revision {roll.revision}, {roll.role} template {roll.template}"
        if roll.phase == "Judging":
            events.append(
                Event(
                    "Normal",
                    reasons.TEMPLATE_HELD,
                    f"{where}: held at its first new pods until they have a verdict",
                )
            )
        elif roll.phase == "Verified":
            events.append(
                Event("Normal", reasons.TEMPLATE_VERIFIED, f"{where}: Verified, the roll goes on")
            )
        elif roll.phase == "Waived":
            events.append(Event("Warning", reasons.VERDICT_WAIVED, f"{where}: {roll.message}"))
        else:
            events.append(
                Event(
                    "Warning",
                    reasons.TEMPLATE_ROLLED_BACK,
                    f"{where} failed its verdict ({roll.reason}); going back to "
                    f"template {roll.verified_template}: {roll.message}",
                )
            )
    return events  # fmt: skip

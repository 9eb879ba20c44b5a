"""The reconcile decision: observed children in, actions, status and events out. Pure.

`decide(observed, now)` proceeds in five steps:

1. validate the spec (`validation.validate`); an unusable or incompatible spec gets no new
   revision and its serving pods are left alone (invariant 7);
2. read the revisions off the observed Deployments and pods (`rollout.states`);
3. ask the planner for one step;
4. render what each revision's workloads, disruption budgets and router should be
   (`writers`) and keep only the writes that change something: a missing child, or a field the
   operator owns that differs (`drift`);
5. gather what it found (`Findings`); once the shell has applied the actions,
   `Decision.report(refused)` builds the status and the events from the context and the
   findings in one pass (`status.report`), saying what the API server accepted and refused.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from pdmtp.api import reasons
from pdmtp.api import vocabulary as v
from pdmtp.core.actions import Action, Event, Rejection
from pdmtp.core.agreement import Agreement
from pdmtp.core.context import Context, Observed, context_of
from pdmtp.core.groups.grouping import workloads
from pdmtp.core.groups.podgroups import missing_workload_api
from pdmtp.core.objects import Obj, format_time, metadata_of, parse_time
from pdmtp.core.pods import ordered, rejected_pods, replacing_waits
from pdmtp.core.rollout.evacuation import evacuate
from pdmtp.core.rollout.planner import plan
from pdmtp.core.rollout.removal import gate, listed_urls, listed_waits, removal_view
from pdmtp.core.rollout.states import revision_states
from pdmtp.core.rollout.steering import canary_traffic, pod_health, steer, target_and_policy, track
from pdmtp.core.scaling.roles import role_scale_counts, scale
from pdmtp.core.status.builder import Findings, parse_status, unusable
from pdmtp.core.status.report import Report, report, unusable_report
from pdmtp.core.validation import validate
from pdmtp.core.verification import revisions, templates
from pdmtp.core.writers import writes


@dataclass(frozen=True)
class Decision:
    """One reconcile's actions, when to look again, and what the status and events are built
    from once the actions ran (`report`)."""

    actions: tuple[Action, ...]
    requeue_after: float | None
    context: Context | None = None
    findings: Findings | None = None
    """With `context`: what this reconcile found; both None for a spec that cannot be served."""
    unusable: Report | None = None
    """The report of a spec that cannot be served: no actions, so nothing to wait for."""

    @property
    def agreement(self) -> Agreement | None:
        """The spec's agreement; None for a spec that cannot be served."""
        return None if self.context is None else self.context.agreement

    def report(self, refused: Sequence[Rejection] = (), unapplied: Collection[str] = ()) -> Report:
        """The status and events once the actions ran (`status.report.report`)."""
        if self.context is None or self.findings is None:
            assert self.unusable is not None
            return self.unusable
        return report(self.context, self.findings, self.actions, refused, unapplied)

    @cached_property
    def accepted(self) -> Report:
        """The report when every write is accepted."""
        return self.report()

    @property
    def status(self) -> dict[str, Any]:
        """The status as written when every write is accepted."""
        return self.accepted.written

    @property
    def status_changed(self) -> bool:
        return self.accepted.status_changed

    @property
    def events(self) -> tuple[Event, ...]:
        return self.accepted.events


def decide(observed: Observed, now: float) -> Decision:
    """One reconcile of one PDDeployment (see the module docstring for the steps)."""
    stamp = format_time(now)
    body = observed.pdd
    raw_status: Obj = body.get("status") or {}
    old = parse_status(raw_status)
    generation = metadata_of(body).get("generation")

    # 1. Validate.
    verdict = validate(body)
    if verdict.pdd is None or verdict.agreement is None:
        refused = unusable(old, generation, verdict.message(), stamp)
        return Decision((), None, unusable=unusable_report(refused, old, raw_status))
    if (missing := missing_workload_api(verdict.agreement, observed.workload_api)) is not None:
        refused = unusable(old, generation, missing, stamp, reasons.WORKLOAD_API_UNAVAILABLE)
        return Decision((), None, unusable=unusable_report(refused, old, raw_status))
    ctx = context_of(observed, verdict.pdd, verdict.agreement, old, raw_status, generation, now)

    # 1b. Autoscale: the counts the roles roll to (scaling is not a rollout: same revision).
    spec_target, spec_policy = target_and_policy(ctx.agreement)
    scaling = None
    if ctx.spec.autoscaling is not None:
        external = role_scale_counts(ctx.others, ctx.name)
        scaling = scale(ctx.spec, old.autoscaling, ctx.pods, ctx.metrics, external, now)
        desired = scaling.desired
        spec_target = replace(spec_target, prefill=desired["prefill"], decode=desired["decode"])

    # 2. Observe, and steer the rollout (pause, canary, deadline, rollback).
    states = revision_states([*ctx.deployments, *workloads(ctx.groups)], ctx.pods)
    # What each revision's decodes did (`core.verification`), and what that holds back.
    verification_spec = ctx.spec.effective_verification
    judged = revisions.verdicts(
        verification_spec, states, ctx.raw_pods, ctx.metrics, spec_target.revision
    )
    # A role-local change rolling inside the spec revision, held for its own verdict.
    rolls = templates.rolls(ctx, spec_target.revision)
    spec_verdict = judged.get(spec_target.revision or "")
    health = pod_health(ctx, revisions.rollout_gate(verification_spec, spec_verdict))
    steering = steer(ctx, spec_target, spec_policy, states, health, any(r.held for r in rolls))

    # 3. Plan, and hold each scale-down until its pods are out of every router's list.
    step = plan(states, steering.target, steering.policy, now)
    # A serving decode whose KV pulls keep failing is marked, and moved as a pod on a cordoned
    # node is: its replacement first, then out of routing and removed through the gate.
    failed = steering.failed_revision if steering.rolling_back else None
    to_replace = revisions.replacements(
        verification_spec,
        states,
        ctx.raw_pods,
        ctx.metrics,
        failed,
        templates.judged_pods(rolls, ctx.raw_pods),
    )
    replacing = {**revisions.marked(ctx.raw_pods), **to_replace}
    engines, routers = removal_view(ctx.pods, ctx.cordoned, replacing)
    evacuated = evacuate(step.revisions, states, engines, steering.policy)
    removal = gate(evacuated, states, engines, routers)
    # A failed template's pods leave routing first; its role goes back once none is listed.
    withdrawn = templates.withdrawn(rolls, ctx.raw_pods)
    removal = replace(removal, leaving=removal.leaving | withdrawn)
    listed = listed_urls(routers)
    still_listed = {
        e.role for e in engines if e.name in withdrawn and e.url in listed.get(e.revision, ())
    }
    rolls = [r.still_listed() if r.role in still_listed else r for r in rolls]

    # 4. Render and diff.
    desired_counts = {r: spec_target.replicas(r) for r in v.ENGINE_ROLES}
    live = {s.revision for s in states}
    written = writes(
        ctx, steering.spec_revision, removal, engines, to_replace, rolls, desired_counts, live
    )

    # 5. What it found: the status and events are built from it once the shell has applied.
    # What the step waits for: the pods, budgets and drains above, and the removal gate's holds.
    facts = ordered(
        [*health.waits, *replacing_waits(ctx.raw_pods, replacing), *listed_waits(removal.waiting)]
    )
    share = canary_traffic(states, steering.target.revision) if step.outcome == "Held" else None
    record = track(old.rollout, steering, step, states, now, share)
    found = Findings(
        states=states,
        step=step,
        steering=steering,
        record=record,
        scaling=scaling,
        failures=health.failures,
        waiting=health.waiting,
        rejected=rejected_pods(ctx.deployments),
        waits=facts,
        verdicts=judged,
        template_rolls=rolls,
        retired=written.retired,
        revision_keys=written.revision_keys,
    )
    return Decision(written.actions, _requeue(ctx, found), ctx, found)


def _requeue(ctx: Context, found: Findings) -> float | None:
    """When to look again: a drain's end, the progress deadline (no event may come, for a
    rollout or a held template roll), or the autoscaler's next evaluation."""
    now, deadline = ctx.now, ctx.spec.rollout.progress_deadline_seconds
    step, record, scaling = found.step, found.record, found.scaling
    waits = [step.requeue_after] if step.requeue_after is not None else []
    for roll in found.template_rolls:
        if roll.held:
            since = parse_time(roll.started_at) or now
            waits.append(max(0.0, since + deadline - now))
    if scaling is not None and scaling.requeue_after is not None:
        waits.append(scaling.requeue_after)
    if record is not None and record.phase == "Progressing":
        since = parse_time(record.last_progress_at) or now
        waits.append(max(0.0, since + deadline - now))
    return min(waits) if waits else None

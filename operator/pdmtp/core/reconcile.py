"""The reconcile decision: observed children in, actions, status and events out. Pure.

`decide(observed, now)` proceeds in five steps:

1. validate the spec (`validation.validate`); an unusable or incompatible spec gets no new
   revision and its serving pods are left alone (invariant 7);
2. read the revisions off the observed Deployments and pods (`rollout.states`);
3. ask the planner for one step;
4. render what each revision's workloads, disruption budgets and router should be
   (`writers`) and keep only the writes that change something: a missing child, or a field the
   operator owns that differs (`drift`);
5. once the shell has applied the actions, `Decision.report(refused)` builds the status
   (`status`) and the events (`events`) from what the API server accepted and refused.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from pdmtp.api import reasons
from pdmtp.api import vocabulary as v
from pdmtp.api.status import PDDeploymentStatus, RolloutStatus
from pdmtp.api.v1alpha1 import PDDeployment
from pdmtp.core import names
from pdmtp.core.actions import (
    Action,
    Delete,
    Event,
    Rejection,
    apply_if_drifted,
)
from pdmtp.core.agreement import Agreement
from pdmtp.core.context import Context, Observed, context_of
from pdmtp.core.groups import podgroups
from pdmtp.core.groups.grouping import workloads
from pdmtp.core.objects import Obj, format_time, labels_of, metadata_of, name_of, parse_time
from pdmtp.core.pods import (
    crash_looping,
    engine_failures,
    ordered,
    rejected_pods,
    replacing_waits,
    unschedulable,
    waits,
)
from pdmtp.core.render.children import (
    shared_children,
)
from pdmtp.core.render.history import (
    history_actions,
)
from pdmtp.core.revision import hash_of
from pdmtp.core.rollout.evacuation import evacuate
from pdmtp.core.rollout.planner import Step, plan
from pdmtp.core.rollout.removal import (
    gate,
    listed_urls,
    listed_waits,
    removal_view,
)
from pdmtp.core.rollout.states import revision_states
from pdmtp.core.rollout.steering import (
    PodHealth,
    Steering,
    canary_traffic,
    steer,
    target_and_policy,
    track,
)
from pdmtp.core.scaling.roles import (
    Scaling,
    role_scale_actions,
    role_scale_counts,
    scale,
)
from pdmtp.core.status.builder import Observations, as_dict, build, parse_status, unusable
from pdmtp.core.status.conditions import Transition
from pdmtp.core.status.events import (
    action_events,
    condition_events,
    revision_events,
    rollout_events,
    stall_events,
    template_events,
)
from pdmtp.core.validation import validate
from pdmtp.core.verification import revisions, templates
from pdmtp.core.verification.templates import TemplateRoll
from pdmtp.core.verification.verdict import Verdict
from pdmtp.core.writers import marks, orphan_budgets, revision_actions, verified_spec


@dataclass(frozen=True)
class Report:
    """What the shell writes back once the actions ran: status (if changed) and events."""

    status: dict[str, Any]
    status_changed: bool
    events: tuple[Event, ...]


@dataclass(frozen=True, kw_only=True)
class _Inputs:
    """What the status is built from, kept so `report` can add the refusals."""

    ctx: Context
    seen: Observations
    steering: Steering
    record: RolloutStatus | None
    scaling: Scaling | None
    retired: frozenset[str]
    revision_keys: Mapping[str, frozenset[str]]


@dataclass(frozen=True)
class Decision:
    actions: tuple[Action, ...]
    requeue_after: float | None
    agreement: Agreement | None = None
    """None when the spec could not be parsed at all."""
    _inputs: _Inputs | None = field(default=None, repr=False)
    _unusable: Report | None = field(default=None, repr=False)

    def report(self, refused: Sequence[Rejection] = (), unapplied: Collection[str] = ()) -> Report:
        """The status and events once the actions ran: `refused` are the writes the API server
        refused (the status says so), `unapplied` the keys of actions never sent or refused as
        stale (the shell stops a step at its first refusal). No event claims any of them."""
        if self._inputs is None:
            assert self._unusable is not None
            return self._unusable
        i = self._inputs
        new, transitions = build(i.ctx, i.seen, i.steering, i.record, i.scaling, refused)
        written = as_dict(new)
        keys = {r.key for r in refused} | set(unapplied)
        old = i.ctx.old
        events = [
            *rollout_events(i.steering),
            *template_events(old.template_rolls or (), i.seen.template_rolls),
            *revision_events(i.seen.step, i.seen.states, i.retired, i.revision_keys, keys),
            *action_events(self.actions, keys),
            *condition_events(transitions, old.conditions, new.conditions),
            *stall_events(old.waiting_for, new.waiting_for),
            *(i.scaling.events if i.scaling is not None else ()),
        ]
        return Report(written, written != _without_none(i.ctx.raw_old), tuple(events))

    @cached_property
    def accepted(self) -> Report:
        """The report when every write is accepted."""
        return self.report()

    @property
    def status(self) -> dict[str, Any]:
        return self.accepted.status

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
        return _unusable(refused, old, raw_status)
    if (missing := _missing_workload_api(verdict.agreement, observed.workload_api)) is not None:
        refused = unusable(old, generation, missing, stamp, reasons.WORKLOAD_API_UNAVAILABLE)
        return _unusable(refused, old, raw_status)
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
    rolls = _template_rolls(ctx, spec_target.revision)
    health = _health(ctx, judged.get(spec_target.revision or ""))
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
    actions: list[Action] = []
    if ctx.agreement.compatible:
        children = shared_children(ctx.pdd, ctx.agreement.settings)
        actions += [a for m in children if (a := apply_if_drifted(m, ctx.existing))]
    pods_there = frozenset(name_of(p) for p in ctx.raw_pods)
    tags = revisions.replacements_of(ctx.raw_pods)
    actions += marks(removal, engines, stamp, to_replace, pods_there, tags)
    retired = set()
    revision_keys: dict[str, frozenset[str]] = {}
    for p in removal.plans:
        writes = revision_actions(ctx, p, steering.spec_revision, removal, rolls)
        actions += writes
        revision_keys[p.revision] = frozenset(a.key for a in writes)
        if p.delete and any(isinstance(a, Delete) for a in writes):
            retired.add(p.revision)
    actions += orphan_budgets(ctx.name, {p.revision for p in removal.plans}, ctx.others)
    desired_counts = {r: spec_target.replicas(r) for r in v.ENGINE_ROLES}
    actions += role_scale_actions(ctx.pdd, desired_counts, ctx.others, ctx.pods)
    if steering.spec_revision is not None:
        live = {s.revision for s in states}
        pinned = {r.name for roll in rolls if (r := verified_spec(ctx, roll)) is not None}
        history = history_actions(
            ctx.pdd, steering.spec_revision, ctx.history, ctx.existing, live, pinned
        )
        actions += history

    # 5. Status and events come from `Decision.report`, after the shell's writes.
    # What the step waits for: the pods, budgets and drains above, and the removal gate's holds.
    facts = ordered(
        [*health.waits, *replacing_waits(ctx.raw_pods, replacing), *listed_waits(removal.waiting)]
    )
    rejected = rejected_pods(ctx.deployments)
    seen = Observations(
        states, step, health.failures, health.waiting, rejected, facts, judged, rolls
    )
    share = canary_traffic(states, steering.target.revision) if step.outcome == "Held" else None
    record = track(old.rollout, steering, step, states, now, share)
    inputs = _Inputs(
        ctx=ctx,
        seen=seen,
        steering=steering,
        record=record,
        scaling=scaling,
        retired=frozenset(retired),
        revision_keys=revision_keys,
    )
    requeue = _requeue(step, record, ctx.pdd, now, scaling, rolls)
    return Decision(tuple(actions), requeue, ctx.agreement, inputs)


def _unusable(
    refused: tuple[PDDeploymentStatus, list[Transition]],
    old: PDDeploymentStatus,
    raw_status: Obj,
) -> Decision:
    """No actions: a spec that cannot be rolled out leaves the serving pods alone; its status
    says why."""
    new, transitions = refused
    written = as_dict(new)
    events = tuple(condition_events(transitions, old.conditions, new.conditions))
    report = Report(written, written != _without_none(raw_status), events)
    return Decision((), None, None, _unusable=report)


def _missing_workload_api(agreement: Agreement, workload_api: str | None) -> str | None:
    """Why a multi-node spec cannot be served (None: it can, or it is not multi-node)."""
    grouped = [r for r in v.ENGINE_ROLES if podgroups.shape_of(agreement, r) is not None]
    if not grouped or workload_api is not None:
        return None
    return (
        f"spec.{grouped[0]}.multiNode needs the Kubernetes Workload API "
        f"({v.WORKLOAD_API_GROUP} PodGroup, versions {', '.join(v.WORKLOAD_API_VERSIONS)}) "
        "to gang-schedule its groups, and this API server serves none: enable the "
        "GenericWorkload feature gate and the API (--runtime-config) on the control plane, "
        "or remove multiNode"
    )


def _health(ctx: Context, spec_verdict: Verdict | None) -> PodHealth:
    """What is wrong with the pods, what the step waits for, and what the spec revision's
    verdict does to its rollout."""
    budgets_seen = [
        o
        for o in ctx.others
        if o.get("kind") == v.DISRUPTION_BUDGET_KIND and labels_of(o).get(v.LABEL_NAME) == ctx.name
    ]
    return PodHealth(
        engine_failures(ctx.raw_pods),
        crash_looping(ctx.raw_pods),
        unschedulable(ctx.raw_pods),
        waits(ctx.raw_pods, ctx.deployments, budgets_seen, ctx.now, cordoned=ctx.cordoned),
        revisions.rollout_gate(ctx.spec.effective_verification, spec_verdict),
    )


def _requeue(
    step: Step,
    record: RolloutStatus | None,
    pdd: PDDeployment,
    now: float,
    scaling: Scaling | None = None,
    rolls: Sequence[TemplateRoll] = (),
) -> float | None:
    """When to look again: a drain's end, the progress deadline (no event may come, for a
    rollout or a held template roll), or the autoscaler's next evaluation."""
    waits = [step.requeue_after] if step.requeue_after is not None else []
    deadline = pdd.spec.rollout.progress_deadline_seconds
    for roll in rolls:
        if roll.held:
            since = parse_time(roll.started_at) or now
            waits.append(max(0.0, since + deadline - now))
    if scaling is not None and scaling.requeue_after is not None:
        waits.append(scaling.requeue_after)
    if record is not None and record.phase == "Progressing":
        since = parse_time(record.last_progress_at) or now
        waits.append(max(0.0, since + pdd.spec.rollout.progress_deadline_seconds - now))
    return min(waits) if waits else None


def _without_none(data: Any) -> Any:
    """The stored status as the writer would have written it (unset fields left out)."""
    if isinstance(data, Mapping):
        return {k: _without_none(val) for k, val in data.items() if val is not None}
    if isinstance(data, list):
        return [_without_none(x) for x in data]
    return data


def _template_rolls(ctx: Context, revision: str | None) -> list[TemplateRoll]:
    """The spec revision's role-local rolls (its single-node roles)."""
    if revision is None or not ctx.agreement.compatible:
        return []
    eff = ctx.agreement.settings
    wanted = {
        r: hash_of(eff, r) for r in v.ENGINE_ROLES if podgroups.shape_of(ctx.agreement, r) is None
    }
    deployments = {
        r: d
        for r in wanted
        if (d := ctx.existing.get(f"Deployment/{names.workload(ctx.name, revision, r)}"))
    }
    old = ctx.old.template_rolls or []
    return templates.rolls(
        ctx.spec, revision, wanted, deployments, ctx.raw_pods, ctx.metrics, old, ctx.now
    )

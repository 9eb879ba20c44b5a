"""What the children should be after a step, as writes (pure; `writes`): the shared children,
and each revision's. The spec revision's engines
rendered from the spec (a role-local roll held or sent back, `verification.templates`), an
older revision's only scaled (or re-created from its recorded spec), a retired one's deletes,
then each revision's disruption budgets and its router; the marks engine pods carry after the
step (leaving, released, replace), the budgets of revisions that are gone, the role scale
objects and the recorded specs. `reconcile` decides the step; only writes that change something
are kept (a missing child, or a field the operator owns that differs: `drift`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pdmtp.api import vocabulary as v
from pdmtp.api.vocabulary import EngineRole
from pdmtp.core import names
from pdmtp.core.actions import (
    Action,
    Annotate,
    Apply,
    Delete,
    Scale,
    apply_if_drifted,
    key_of,
)
from pdmtp.core.agreement import Agreement, check
from pdmtp.core.context import Context
from pdmtp.core.groups import podgroups
from pdmtp.core.groups.actions import group_actions
from pdmtp.core.objects import (
    Obj,
    format_time,
    is_terminating,
    labels_of,
    name_of,
    resource_version,
)
from pdmtp.core.render import budgets
from pdmtp.core.render.children import (
    engine_deployment,
    engine_pod_template,
    held,
    router_deployment,
    shared_children,
)
from pdmtp.core.render.history import Recorded, history_actions, latest_spec, with_template
from pdmtp.core.render.membership import revision_membership
from pdmtp.core.rollout.planner import RevisionPlan
from pdmtp.core.rollout.removal import EnginePod, Removal
from pdmtp.core.scaling.roles import role_scale_actions
from pdmtp.core.verification.revisions import replacements_of
from pdmtp.core.verification.templates import TemplateRoll

Shapes = dict[EngineRole, int | None]
"""Per engine role with a workload to guard: None for a Deployment's pods, else pods per group
(`budgets`). A role with none (a dead revision's, awaiting retirement) has no entry."""


@dataclass(frozen=True)
class Writes:
    actions: tuple[Action, ...]
    retired: frozenset[str]
    """Revisions whose workloads this step deletes."""
    revision_keys: Mapping[str, frozenset[str]]
    """Each revision's writes, by action key: its events claim only those applied."""


def writes(
    ctx: Context,
    spec_revision: str | None,
    removal: Removal,
    engines: Sequence[EnginePod],
    to_replace: Mapping[str, str],
    rolls: Sequence[TemplateRoll],
    desired: Mapping[EngineRole, int],
    live: Collection[str],
) -> Writes:
    """Every write of a step: `removal` is the gated step, `to_replace` the pods marked for
    replacement now (with why), `desired` each role's count, `live` the revisions observed."""
    actions: list[Action] = []
    if ctx.agreement.compatible:
        children = shared_children(ctx.pdd, ctx.agreement.settings)
        actions += [a for m in children if (a := apply_if_drifted(m, ctx.existing))]
    pods_there = frozenset(name_of(p) for p in ctx.raw_pods)
    tags = replacements_of(ctx.raw_pods)
    actions += marks(removal, engines, ctx.stamp, to_replace, pods_there, tags)
    retired = set()
    revision_keys: dict[str, frozenset[str]] = {}
    for p in removal.plans:
        revision = revision_actions(ctx, p, spec_revision, removal, rolls)
        actions += revision
        revision_keys[p.revision] = frozenset(a.key for a in revision)
        if p.delete and any(isinstance(a, Delete) for a in revision):
            retired.add(p.revision)
    actions += orphan_budgets(ctx.name, {p.revision for p in removal.plans}, ctx.others)
    actions += role_scale_actions(ctx.pdd, desired, ctx.others, ctx.pods)
    if spec_revision is not None:
        pinned = {r.name for roll in rolls if (r := verified_spec(ctx, roll)) is not None}
        actions += history_actions(ctx.pdd, spec_revision, ctx.history, ctx.existing, live, pinned)
    return Writes(tuple(actions), frozenset(retired), revision_keys)


def revision_actions(
    ctx: Context,
    p: RevisionPlan,
    spec_revision: str | None,
    removal: Removal,
    rolls: Sequence[TemplateRoll] = (),
) -> list[Action]:
    """One revision's writes: its workloads (the spec revision's rendered, another's only
    scaled), then its disruption budgets and its router; or, once retired, its deletes."""
    if p.delete:
        return _retire(ctx, p)
    if p.revision == spec_revision:
        actions, shapes = _spec_workloads(ctx, p, removal, rolls)
    else:
        actions, shapes = _older_workloads(ctx, p, removal)
    return actions + _budgets_and_router(ctx, p, shapes, removal)


def _retire(ctx: Context, p: RevisionPlan) -> list[Action]:
    # The budgets go first: one left behind by a refused delete would outlive its revision,
    # while a revision kept after all gets its budget back (rendered while it lives).
    name, existing = ctx.name, ctx.existing
    budget_names = [names.disruption_budget(name, p.revision, r) for r in v.ENGINE_ROLES]
    deletes: list[Action] = [
        Delete(v.DISRUPTION_BUDGET_KIND, b)
        for b in budget_names
        if f"{v.DISRUPTION_BUDGET_KIND}/{b}" in existing
    ]
    deletes += [
        Delete("Deployment", names.workload(name, p.revision, r))
        for r in v.ROLES
        if f"Deployment/{names.workload(name, p.revision, r)}" in existing
    ]
    deletes += group_actions([g for g in ctx.groups if g.revision == p.revision], 0, None)
    deletes += [
        Delete("Service", names.workload(name, p.revision, r))
        for r in v.ENGINE_ROLES
        if f"Service/{names.workload(name, p.revision, r)}" in existing
    ]
    return deletes


def _spec_workloads(
    ctx: Context, p: RevisionPlan, removal: Removal, rolls: Sequence[TemplateRoll]
) -> tuple[list[Action], Shapes]:
    """The spec revision's engines, rendered from the spec: Deployments (a role whose new
    template is judged held at its first new pods, one whose new template failed rendered from
    the spec that had the Verified one), or groups."""
    actions: list[Action] = []
    shapes: Shapes = {}
    for role in v.ENGINE_ROLES:
        shape = podgroups.shape_of(ctx.agreement, role)
        shapes[role] = None if shape is None else shape.nodes
        if shape is not None:
            actions += _group_role(ctx, p, role, ctx.agreement, removal)
            continue
        roll = next((r for r in rolls if r.role == role), None)
        back = None if roll is None or roll.revert_to is None else verified_spec(ctx, roll)
        verified = None if back is None or (spec := back.parsed()) is None else check(spec)
        agreement = verified if verified is not None and verified.compatible else ctx.agreement
        manifest = engine_deployment(ctx.pdd, p.revision, role, p.replicas(role), agreement)
        # Held while judged, and while a failed one cannot go back yet (a router still lists
        # its pods) or at all (its Verified spec is gone).
        failed = roll is not None and roll.phase == "Failed"
        hold = roll is not None and (roll.held or (failed and back is None))
        live = ctx.existing.get(key_of(manifest))
        if change := apply_if_drifted(held(manifest, hold, live), ctx.existing):
            actions.append(change)
    return actions, shapes


def verified_spec(ctx: Context, roll: TemplateRoll) -> Recorded | None:
    return with_template(ctx.history, roll.revision, roll.role, roll.verified_template)


def _older_workloads(
    ctx: Context, p: RevisionPlan, removal: Removal
) -> tuple[list[Action], Shapes]:
    """Another revision's engines: its template is history, so only scale it. A deleted one is
    re-created from its recorded spec where there is one."""
    actions: list[Action] = []
    shapes: Shapes = {}
    old_spec = None
    for role in v.ENGINE_ROLES:
        role_groups = [g for g in ctx.groups if g.revision == p.revision and g.role == role]
        workload = names.workload(ctx.name, p.revision, role)
        current = ctx.existing.get(f"Deployment/{workload}")
        if current is not None:
            shapes[role] = None
            was = int((current.get("spec") or {}).get("replicas") or 0)
            if was != p.replicas(role):
                actions.append(Scale(workload, p.replicas(role), was, resource_version(current)))
            continue
        old_spec = old_spec or latest_spec(ctx.history, p.revision)
        old = check(old_spec) if old_spec is not None else None
        shape = None if old is None else podgroups.shape_of(old, role)
        if role_groups or shape is not None:
            actions += _group_role(ctx, p, role, old, removal)
            sizes = [g.size for g in role_groups if g.size]
            nodes = max(sizes) if sizes else None if shape is None else shape.nodes
            if nodes is not None:
                shapes[role] = nodes
        elif old is not None and p.replicas(role) > 0:
            manifest = engine_deployment(ctx.pdd, p.revision, role, p.replicas(role), old)
            actions.append(Apply(manifest, exists=False))
            shapes[role] = None
    return actions, shapes


def _group_role(
    ctx: Context, p: RevisionPlan, role: EngineRole, agreement: Agreement | None, removal: Removal
) -> list[Action]:
    """A multi-node role of one revision: its headless Service and its groups. Without the
    revision's settings (`agreement` None) its groups can only be removed."""
    mine = [g for g in ctx.groups if g.revision == p.revision and g.role == role]
    render = None
    actions: list[Action] = []
    if agreement is not None and podgroups.shape_of(agreement, role) is not None:
        service = podgroups.group_service(ctx.pdd, p.revision, role)
        if change := apply_if_drifted(service, ctx.existing):
            actions.append(change)
        template = engine_pod_template(ctx.pdd, p.revision, role, agreement)
        api = ctx.workload_api or podgroups.DEFAULT_WORKLOAD_API

        def render(gid: str) -> list[dict[str, Any]]:
            return podgroups.group_objects(ctx.pdd, p.revision, role, gid, template, agreement, api)

    return actions + group_actions(mine, p.replicas(role), render, removal.released)


def _budgets_and_router(
    ctx: Context, p: RevisionPlan, shapes: Shapes, removal: Removal
) -> list[Action]:
    """After the workloads: a group count that drops has its groups deleted before the budget
    shrinks with it, so their pods never count twice (`budgets`). Then the router, listing the
    revision's engines that are not leaving."""
    eff = ctx.agreement.settings
    actions: list[Action] = []
    for role, nodes in shapes.items():
        allowed = budgets.allowance(eff.rollout, grouped=nodes is not None)
        budget = budgets.disruption_budget_manifest(
            ctx.pdd, p.revision, role, allowed, nodes, p.replicas(role)
        )
        if change := apply_if_drifted(budget, ctx.existing):
            actions.append(change)
    membership = revision_membership(
        ctx.pods,
        deployment_name=ctx.name,
        revision=p.revision,
        bootstrap_port=eff.shared.kv_transfer.bootstrap_port,
        leaving=removal.leaving,
    )
    drain, stopped = (
        None if t is None else format_time(t) for t in (p.drain_until, p.traffic_stopped)
    )
    router = router_deployment(ctx.pdd, eff, p.revision, p.router, membership, drain, stopped)
    if change := apply_if_drifted(router, ctx.existing):
        actions.append(change)
    return actions


def orphan_budgets(name: str, live: Collection[str], others: Sequence[Obj]) -> list[Action]:
    """Deletes of budgets whose revision is gone (retired while a delete was refused, or before
    the operator rendered budgets at all): nothing else would remove them before their owner."""
    return [
        Delete(v.DISRUPTION_BUDGET_KIND, name_of(o))
        for o in others
        if o.get("kind") == v.DISRUPTION_BUDGET_KIND
        and labels_of(o).get(v.LABEL_NAME) == name
        and labels_of(o).get(v.LABEL_REVISION) not in live
        and not is_terminating(o)
    ]


def marks(
    removal: Removal,
    engines: Sequence[EnginePod],
    stamp: str,
    replace: Mapping[str, str],
    pods_there: frozenset[str],
    replacement_of: Mapping[str, str],
) -> list[Action]:
    """The leaving and release marks engine pods must carry after this step, the replace mark
    (and its time) of the pods to start replacing (`replace`: pod -> why), and the tag of the
    pods that replace them (`replacement_of`: pod -> the pod it replaces). A multi-node group's
    marks live on its leader pod: a group whose leader is gone is replaced whole in this step,
    and there is nothing to mark (`pods_there`: the pods that exist)."""
    changes = {pod: (leaving, released) for pod, leaving, released in removal.changes(engines)}
    out: list[Action] = []
    for was in sorted(engines, key=lambda e: e.name):
        if was.name not in pods_there:
            continue
        leaving, released = changes.get(was.name, (was.leaving, was.released))
        notes: dict[str, str | None] = {}
        if was.name in replace:
            notes[v.ANNOTATION_REPLACE] = replace[was.name]
            notes[v.ANNOTATION_REPLACE_SINCE] = stamp
        if was.name in replacement_of:
            notes[v.ANNOTATION_REPLACEMENT_OF] = replacement_of[was.name]
        if leaving != was.leaving:
            notes[v.ANNOTATION_LEAVING] = stamp if leaving else None
        if released != was.released:
            notes[v.ANNOTATION_DELETION_COST] = v.RELEASED_DELETION_COST if released else None
        if notes:
            out.append(Annotate(was.name, notes, leaving))
    return out

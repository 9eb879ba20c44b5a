"""spec.autoscaling applied: the counts each role rolls to, from the autoscaler's decision. Pure.

`scale(spec, old, pods, metrics, external, now)` turns the status's remembered recommendations and
changes into the decision's history, the engine pods and their scrapes into observations, calls
`pdmtp.core.scaling.autoscaler.evaluate` on spec.autoscaling once per interval, and
returns the desired count per role with the status to write and the events to post. Between two
evaluations the counts stay as the status says, so a reconcile that an unrelated event triggers
moves nothing; a changed bound (min/max, a role's own replicas, the band) or a new count on an
External role's scale endpoint is acted on at once.

The status is the only memory: a restarted operator resumes its windows from it, and a decision
whose status write was refused is taken again at the next reconcile.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from pdmtp.api import reasons
from pdmtp.api import vocabulary as v
from pdmtp.api.autoscaling import EXTERNAL, AutoscalingSpec, Source, exact, replica_bounds
from pdmtp.api.status import (
    AutoscalingStatus,
    RoleScaling,
    ScaleChange,
    ScaleSample,
    SignalValue,
)
from pdmtp.api.v1alpha1 import PDDeployment, PDDeploymentSpec
from pdmtp.api.vocabulary import EngineRole
from pdmtp.core import names
from pdmtp.core.actions import Action, Apply, Delete, Event, SetStatus
from pdmtp.core.objects import (
    Obj,
    format_time,
    is_terminating,
    labels_of,
    name_of,
    parse_time,
    pod_ready,
)
from pdmtp.core.scaling import autoscaler as a
from pdmtp.core.windows import PodMetrics

EARLY_SECONDS = 0.5
"""An evaluation this close to its interval counts as due (requeues land a little early)."""


@dataclass(frozen=True)
class Scaling:
    desired: Mapping[EngineRole, int]
    """The replicas each engine role rolls to."""
    status: AutoscalingStatus
    events: tuple[Event, ...] = ()
    requeue_after: float | None = None
    """When the next evaluation is due."""


def _history(role: RoleScaling | None) -> a.RoleHistory:
    if role is None:
        return a.RoleHistory()
    recommendations = tuple(
        a.Recommendation(at, s.replicas)
        for s in role.recommendations
        if (at := parse_time(s.at)) is not None
    )
    changes = tuple(
        a.ScaleEvent(at, c.before, c.after)
        for c in role.changes
        if (at := parse_time(c.at)) is not None
    )
    return a.RoleHistory(recommendations, changes)


def _live(pods: Sequence[Obj], role: EngineRole) -> list[Obj]:
    """The role's pods that are not terminating, of every revision (a roll's surge serves too)."""
    return [p for p in pods if labels_of(p).get(v.LABEL_ROLE) == role and not is_terminating(p)]


def observations(
    pods: Sequence[Obj], metrics: Mapping[str, PodMetrics], role: EngineRole
) -> list[a.PodObservation]:
    """The role's live engine pods and their scrapes."""
    out = []
    for pod in _live(pods, role):
        seen = metrics.get(name_of(pod), PodMetrics())
        out.append(a.PodObservation(name_of(pod), pod_ready(pod), seen.latest, seen.previous))
    return out


def role_scale_counts(others: Sequence[Obj], name: str) -> dict[EngineRole, int | None]:
    """The count each role's PDRoleScale asks for (External roles read it)."""
    out: dict[EngineRole, int | None] = {}
    for obj in others:
        labels = labels_of(obj)
        if obj.get("kind") != v.ROLE_SCALE_KIND or labels.get(v.LABEL_NAME) != name:
            continue
        replicas = (obj.get("spec") or {}).get("replicas")
        for role in v.ENGINE_ROLES:
            if labels.get(v.LABEL_ROLE) == role and isinstance(replicas, int):
                out[role] = replicas
    return out


def role_scale_actions(
    pdd: PDDeployment,
    desired: Mapping[EngineRole, int],
    others: Sequence[Obj],
    pods: Sequence[Obj],
) -> list[Action]:
    """Each External role's PDRoleScale: created once at the role's count (its spec.replicas is
    then the HPA's, never written again), its status kept to the role's live pods and selector;
    deleted once the role is no longer External."""
    name = pdd.metadata.name
    auto = pdd.spec.autoscaling
    existing = {
        name_of(o): o
        for o in others
        if o.get("kind") == v.ROLE_SCALE_KIND and labels_of(o).get(v.LABEL_NAME) == name
    }
    actions: list[Action] = []
    for role in v.ENGINE_ROLES:
        child = names.role_scale(name, role)
        current = existing.get(child)
        if auto is None or _source(auto, role) != EXTERNAL:
            if current is not None:
                actions.append(Delete(v.ROLE_SCALE_KIND, child))
            continue
        if current is None:
            actions.append(Apply(role_scale_manifest(pdd, role, desired[role]), exists=False))
            continue
        status = {"replicas": len(_live(pods, role)), "selector": names.role_selector(name, role)}
        seen = current.get("status") or {}
        if {k: seen.get(k) for k in status} != status:
            actions.append(SetStatus(v.ROLE_SCALE_KIND, child, status, seen))
    return actions


def role_scale_manifest(pdd: PDDeployment, role: EngineRole, replicas: int) -> dict[str, Any]:
    name = pdd.metadata.name
    return {
        "apiVersion": v.API_VERSION,
        "kind": v.ROLE_SCALE_KIND,
        "metadata": {
            "name": names.role_scale(name, role),
            "namespace": pdd.metadata.namespace,
            "labels": {**names.base_labels(name), v.LABEL_ROLE: role},
            "ownerReferences": [names.owner_reference(pdd)],
        },
        "spec": {"replicas": replicas},
    }


def _clamp(value: int, spec: PDDeploymentSpec, role: EngineRole) -> int:
    low, high = replica_bounds(spec, role)
    return min(max(value, low), high)


def scale(
    spec: PDDeploymentSpec,
    old: AutoscalingStatus | None,
    pods: Sequence[Obj],
    metrics: Mapping[str, PodMetrics],
    external: Mapping[EngineRole, int | None],
    now: float,
) -> Scaling:
    """The counts the roles roll to, and the autoscaling status (spec.autoscaling is set)."""
    auto = spec.autoscaling
    assert auto is not None
    before = {r.name: r for r in old.roles} if old is not None else {}
    current = {
        role: _clamp(
            before[role].desired_replicas if role in before else spec.role(role).replicas,
            spec,
            role,
        )
        for role in v.ENGINE_ROLES
    }
    last = None if old is None else parse_time(old.last_evaluation_time)
    asked = {
        role: external.get(role) if _source(auto, role) == EXTERNAL else None
        for role in v.ENGINE_ROLES
    }
    moved = any(
        role in before
        and (
            before[role].desired_replicas != current[role]
            or (asked[role] is not None and asked[role] != before[role].recommendation)
        )
        for role in v.ENGINE_ROLES
    )
    band = auto.ratio
    unbanded = band is not None and not (
        exact(band.min) <= Fraction(current["prefill"], current["decode"]) <= exact(band.max)
    )
    due = last is None or now >= last + auto.interval_seconds - EARLY_SECONDS
    if not (due or moved or unbanded or set(before) != _autoscaled(auto)):
        assert old is not None and last is not None
        return Scaling(current, old, (), max(0.0, last + auto.interval_seconds - now))

    decision = a.evaluate(
        auto,
        {role: observations(pods, metrics, role) for role in v.ENGINE_ROLES},
        current,
        {role: _history(before.get(role)) for role in v.ENGINE_ROLES},
        now,
        asked,
    )
    stamp = format_time(now)
    roles, events = [], []
    for role in v.ENGINE_ROLES:
        made, scaling = decision.roles[role], auto.role(role)
        if scaling is None:
            continue
        was = before.get(role)
        if made.changed:
            reason = (
                reasons.AUTOSCALED_UP if made.desired > made.current else reasons.AUTOSCALED_DOWN
            )
            events.append(Event("Normal", reason, made.reason))
        roles.append(_role_status(role, scaling.source, made, decision, pods, stamp, was))
    desired = {role: decision.roles[role].desired for role in v.ENGINE_ROLES}
    status = AutoscalingStatus(
        last_evaluation_time=stamp, ratio_note=decision.ratio_note, roles=roles
    )
    return Scaling(desired, status, tuple(events), float(auto.interval_seconds))


def _source(auto: AutoscalingSpec, role: EngineRole) -> str | None:
    scaling = auto.role(role)
    return None if scaling is None else scaling.source


def _autoscaled(auto: AutoscalingSpec) -> set[str]:
    return {role for role in v.ENGINE_ROLES if auto.role(role) is not None}


def _role_status(
    role: EngineRole,
    source: Source,
    made: a.RoleDecision,
    decision: a.Evaluation,
    pods: Sequence[Obj],
    stamp: str,
    was: RoleScaling | None,
) -> RoleScaling:
    history = decision.history[role]
    ready = sum(1 for p in _live(pods, role) if pod_ready(p))
    last_scale = stamp if made.changed else (was.last_scale_time if was is not None else None)
    return RoleScaling(
        name=role,
        source=source,
        desired_replicas=made.desired,
        current_replicas=ready,
        recommendation=made.recommendation,
        deciding_signal=None if made.deciding_signal is None else str(made.deciding_signal),
        reason=made.reason[:4096],
        last_scale_time=last_scale,
        acceptance_length=None if made.acceptance is None else made.acceptance.observed,
        signals=[
            SignalValue(
                signal=str(r.signal),
                value=None if r.value is None else round(r.value, 6),
                target=round(r.target, 6),
                desired=r.desired,
                coverage=r.coverage.value,
            )
            for r in made.readings
        ],
        recommendations=[
            ScaleSample(at=format_time(x.at), replicas=x.replicas) for x in history.recommendations
        ],
        changes=[
            ScaleChange(at=format_time(x.at), before=x.before, after=x.after)
            for x in history.scale_events
        ],
    )

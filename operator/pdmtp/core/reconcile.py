"""The reconcile decision: observed children in, actions and status out. Pure.

`decide(observed, now)` proceeds in five steps:

1. parse and validate the spec (agreement rules); an unusable or incompatible spec gets no new
   revision and its serving pods are left alone (invariant 7);
2. read the revisions off the listed Deployments and pods;
3. ask the planner for one step;
4. render what each revision's workloads should be and keep only the writes that change
   something (an applied-hash annotation makes an unchanged child cost nothing);
5. compute the status and the events its transitions deserve.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from pdmtp.api.v1alpha1 import PDDeployment
from pdmtp.core import names, reasons
from pdmtp.core import vocabulary as v
from pdmtp.core.agreement import Agreement, check
from pdmtp.core.conditions import ConditionUpdate, Transition, set_conditions
from pdmtp.core.observe import (
    PodIssue,
    annotations_of,
    engine_failures,
    format_time,
    labels_of,
    revision_states,
    unschedulable,
)
from pdmtp.core.planner import Policy, RevisionPlan, RevisionState, Step, Target, plan
from pdmtp.core.planner import availability_floor as floor_of
from pdmtp.core.render import (
    engine_deployment,
    router_deployment,
    shared_children,
)
from pdmtp.core.revision import compat_revision
from pdmtp.core.router import revision_membership
from pdmtp.core.vocabulary import Role

Obj = Mapping[str, Any]
Manifest = dict[str, Any]


@dataclass(frozen=True)
class Observed:
    """What the shell listed for one PDDeployment."""

    pdd: Obj
    deployments: Sequence[Obj] = ()
    pods: Sequence[Obj] = ()
    others: Sequence[Obj] = ()
    """Services, NetworkPolicies and ServiceAccounts labelled with the PDDeployment's name."""


@dataclass(frozen=True)
class Apply:
    """Create or update a child with server-side apply."""

    manifest: Manifest
    exists: bool

    @property
    def key(self) -> str:
        return f"{self.manifest['kind']}/{self.manifest['metadata']['name']}"


@dataclass(frozen=True)
class Scale:
    """Set an old revision's Deployment replicas and nothing else (its template is history)."""

    name: str
    replicas: int
    was: int


@dataclass(frozen=True)
class Delete:
    kind: str
    name: str


Action = Apply | Scale | Delete


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class Decision:
    actions: tuple[Action, ...]
    status: dict[str, Any]
    status_changed: bool
    events: tuple[Event, ...]
    requeue_after: float | None
    agreement: Agreement | None = None
    """None when the spec could not be parsed at all."""


def manifest_hash(manifest: Manifest) -> str:
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def stamped(manifest: Manifest) -> Manifest:
    """The manifest with its own hash as an annotation, for the next reconcile to compare."""
    digest = manifest_hash(manifest)
    meta = manifest["metadata"]
    meta["annotations"] = {**(meta.get("annotations") or {}), v.ANNOTATION_APPLIED_HASH: digest}
    return manifest


def _apply_if_changed(manifest: Manifest, observed: Mapping[str, Obj]) -> Apply | None:
    key = f"{manifest['kind']}/{manifest['metadata']['name']}"
    current = observed.get(key)
    stamped(manifest)
    wanted = manifest["metadata"]["annotations"][v.ANNOTATION_APPLIED_HASH]
    if current is not None and annotations_of(current).get(v.ANNOTATION_APPLIED_HASH) == wanted:
        return None
    return Apply(manifest, exists=current is not None)


def _index(objs: Sequence[Obj]) -> dict[str, Obj]:
    return {f"{o.get('kind')}/{(o.get('metadata') or {}).get('name')}": o for o in objs}


def _role_counts(states: Sequence[RevisionState], role: str, update: str | None) -> dict[str, int]:
    def of(s: RevisionState) -> Any:
        return s.router if role == "router" else s.role(role)  # type: ignore[arg-type]

    return {
        "replicas": sum(of(s).pods for s in states),
        "ready": sum(of(s).ready for s in states),
        "updated": sum(of(s).ready for s in states if s.revision == update),
    }


def _phase(state: RevisionState) -> str:
    if state.serving:
        return "Serving"
    if state.draining:
        return "Draining"
    if state.routed:
        return "Starting"
    return "Starting" if state.prefill.replicas or state.decode.replicas else "Retired"


def _status(
    pdd: PDDeployment,
    old_status: Obj,
    agreement: Agreement,
    target: Target,
    states: Sequence[RevisionState],
    step: Step,
    failures: Sequence[PodIssue],
    waiting: Sequence[PodIssue],
    now: str,
) -> tuple[dict[str, Any], list[Transition]]:
    spec = pdd.spec
    policy = Policy(
        spec.rollout.max_surge, spec.rollout.max_unavailable, spec.rollout.drain_seconds
    )
    serving = [s for s in states if s.serving]
    update = target.revision or old_status.get("updateRevision")
    current = serving[0].revision if serving else None
    if current is None and any(s.revision == old_status.get("currentRevision") for s in states):
        current = old_status.get("currentRevision")

    updates: list[ConditionUpdate] = []
    if agreement.compatible:
        look = agreement.decode_lookahead
        detail = "both roles derive the same prefill lookahead" + (
            f" ({look}, prefill backoff {agreement.prefill_backoff})" if look is not None else ""
        )
        updates.append(
            ConditionUpdate(reasons.CONFIG_COMPATIBLE, "True", reasons.COMPATIBLE, detail)
        )
    else:
        first = agreement.findings[0]
        message = "; ".join(f.message for f in agreement.findings)
        updates.append(ConditionUpdate(reasons.CONFIG_COMPATIBLE, "False", first.reason, message))

    floor = floor_of(target, policy)
    ready = {r: sum(s.role(r).ready for s in serving) for r in v.ENGINE_ROLES}
    if not serving:
        updates.append(
            ConditionUpdate(
                reasons.AVAILABLE,
                "False",
                reasons.NO_SERVING_REVISION,
                "no revision has a ready router with a ready prefill and decode yet",
            )
        )
    elif all(ready[r] >= max(1, floor[r]) for r in v.ENGINE_ROLES):
        updates.append(
            ConditionUpdate(
                reasons.AVAILABLE,
                "True",
                reasons.MINIMUM_REPLICAS_AVAILABLE,
                f"serving {ready['prefill']} prefill and {ready['decode']} decode ready pods "
                f"through {len(serving)} revision(s)",
            )
        )
    else:
        updates.append(
            ConditionUpdate(
                reasons.AVAILABLE,
                "False",
                reasons.MINIMUM_REPLICAS_UNAVAILABLE,
                f"serving {ready['prefill']} prefill and {ready['decode']} decode ready pods, "
                f"below the minimum {floor['prefill']} and {floor['decode']}",
            )
        )

    if not agreement.compatible:
        updates.append(
            ConditionUpdate(
                reasons.PROGRESSING,
                "False",
                reasons.ROLLOUT_BLOCKED,
                "the spec is incompatible: no new revision starts"
                + (f"; {current} keeps serving" if current else ""),
            )
        )
    elif step.complete:
        updates.append(
            ConditionUpdate(
                reasons.PROGRESSING,
                "False",
                reasons.ROLLOUT_COMPLETE,
                f"revision {target.revision} is fully rolled out",
            )
        )
    else:
        olds = [s.revision for s in states if s.revision != target.revision]
        what = f"rolling from {', '.join(olds)} to" if olds else "scaling"
        stuck = [u for u in waiting if u.revision == target.revision]
        if stuck:
            updates.append(
                ConditionUpdate(
                    reasons.PROGRESSING,
                    "True",
                    reasons.PODS_UNSCHEDULABLE,
                    f"{what} {target.revision}: the scheduler cannot place {len(stuck)} pod(s) "
                    f"({stuck[0].role} {stuck[0].pod}: {stuck[0].message}); add capacity or "
                    "allow spec.rollout.maxUnavailable so old pods make room",
                )
            )
        else:
            updates.append(
                ConditionUpdate(
                    reasons.PROGRESSING,
                    "True",
                    reasons.ROLLOUT_IN_PROGRESS,
                    f"{what} {target.revision}",
                )
            )

    if failures:
        f = failures[0]
        refused = f.exit_code == v.LAUNCHER_REFUSED_EXIT_CODE
        updates.append(
            ConditionUpdate(
                reasons.DEGRADED,
                "True",
                reasons.ENGINE_REFUSED_CONFIG if refused else reasons.ENGINE_TERMINATED,
                f"{f.role} pod {f.pod} (revision {f.revision}) exited {f.exit_code}: {f.message}"
                + (f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""),
            )
        )
    else:
        updates.append(
            ConditionUpdate(
                reasons.DEGRADED,
                "False",
                reasons.AS_EXPECTED,
                "no engine container has terminated with an error",
            )
        )

    conditions, transitions = set_conditions(
        old_status.get("conditions") or [], updates, pdd.metadata.generation, now
    )
    desired = {
        "prefill": spec.prefill.replicas,
        "decode": spec.decode.replicas,
        "router": spec.router.replicas,
    }
    roles = []
    for role in ("prefill", "decode", "router"):
        counts = _role_counts(states, role, update)
        roles.append(
            {
                "name": role,
                "replicas": counts["replicas"],
                "readyReplicas": counts["ready"],
                "updatedReplicas": counts["updated"],
                "desiredReplicas": desired[role],
            }
        )
    status: dict[str, Any] = {
        "observedGeneration": pdd.metadata.generation,
        "lookahead": {
            "prefill": agreement.prefill_lookahead,
            "decode": agreement.decode_lookahead,
            "prefillBackoff": agreement.prefill_backoff,
        },
        "currentRevision": current,
        "updateRevision": update,
        "prefill": f"{roles[0]['readyReplicas']}/{desired['prefill']}",
        "decode": f"{roles[1]['readyReplicas']}/{desired['decode']}",
        "roles": roles,
        "revisions": [
            {
                "revision": s.revision,
                "phase": _phase(s),
                "prefill": f"{s.prefill.ready}/{s.prefill.replicas}",
                "decode": f"{s.decode.ready}/{s.decode.replicas}",
                "routers": s.router.ready,
            }
            for s in states
        ],
        "conditions": conditions,
    }
    return _drop_none(status), transitions


def _drop_none(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _drop_none(val) for k, val in data.items() if val is not None}
    if isinstance(data, list):
        return [_drop_none(x) for x in data]
    return data


def _transition_event(t: Transition) -> Event:
    bad = (t.type == reasons.DEGRADED and t.new == "True") or (
        t.type in (reasons.CONFIG_COMPATIBLE, reasons.AVAILABLE) and t.new == "False"
    )
    return Event("Warning" if bad else "Normal", t.reason, f"{t.type}={t.new}: {t.message}")


def _unusable(body: Obj, error: ValidationError, now: str) -> Decision:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors()
    )
    old_status = body.get("status") or {}
    update = ConditionUpdate(reasons.CONFIG_COMPATIBLE, "False", reasons.INVALID_SPEC, problems)
    generation = (body.get("metadata") or {}).get("generation")
    conditions, transitions = set_conditions(
        old_status.get("conditions") or [], [update], generation, now
    )
    status = {**old_status, "observedGeneration": generation, "conditions": conditions}
    return Decision(
        (), status, status != old_status, tuple(_transition_event(t) for t in transitions), None
    )


def decide(observed: Observed, now: float) -> Decision:
    """One reconcile of one PDDeployment (see the module docstring for the steps)."""
    stamp = format_time(now)
    body = observed.pdd
    old_status: Obj = body.get("status") or {}
    # 1. Validate.
    try:
        pdd = PDDeployment.model_validate({**body, "status": None})
    except ValidationError as e:
        return _unusable(body, e, stamp)
    spec = pdd.spec
    name = pdd.metadata.name
    agreement = check(spec)
    revision = compat_revision(spec) if agreement.compatible else None
    target = Target(revision, spec.prefill.replicas, spec.decode.replicas, spec.router.replicas)
    policy = Policy(
        spec.rollout.max_surge, spec.rollout.max_unavailable, spec.rollout.drain_seconds
    )

    # 2. Observe.
    mine = [o for o in observed.deployments if labels_of(o).get(v.LABEL_NAME) == name]
    pods = [p for p in observed.pods if labels_of(p).get(v.LABEL_NAME) == name]
    states = revision_states(mine, pods)

    # 3. Plan.
    step = plan(states, target, policy, now)

    # 4. Render and diff.
    existing = _index([{**d, "kind": "Deployment"} for d in mine] + list(observed.others))
    actions: list[Action] = []
    events: list[Event] = []
    if agreement.compatible:
        for manifest in shared_children(pdd):
            change = _apply_if_changed(manifest, existing)
            if change:
                actions.append(change)
    by_revision = {s.revision: s for s in states}
    for p in step.revisions:
        revision_actions = _revision_actions(pdd, p, target, agreement, existing, pods)
        actions += revision_actions
        before = by_revision.get(p.revision)
        if p.delete and any(isinstance(a, Delete) for a in revision_actions):
            events.append(
                Event(
                    "Normal", "RevisionRetired", f"Retired revision {p.revision}: its drain is over"
                )
            )
        elif p.drain_until is not None and before is not None and not before.draining:
            events.append(
                Event(
                    "Normal",
                    "TrafficStopped",
                    f"Stopped routing to revision {p.revision}; its pods drain "
                    f"until {format_time(p.drain_until)}",
                )
            )
    for a in actions:
        if isinstance(a, Apply) and not a.exists:
            events.append(Event("Normal", "Created", f"Created {a.key}"))
        elif isinstance(a, Scale):
            events.append(
                Event(
                    "Normal", "Scaled", f"Scaled Deployment/{a.name} from {a.was} to {a.replicas}"
                )
            )

    # 5. Status.
    failures = engine_failures(pods)
    waiting = unschedulable(pods)
    status, transitions = _status(
        pdd, old_status, agreement, target, states, step, failures, waiting, stamp
    )
    events += [_transition_event(t) for t in transitions]
    changed = _drop_none(dict(old_status)) != status
    return Decision(tuple(actions), status, changed, tuple(events), step.requeue_after, agreement)


def _revision_actions(
    pdd: PDDeployment,
    p: RevisionPlan,
    target: Target,
    agreement: Agreement,
    existing: Mapping[str, Obj],
    pods: Sequence[Obj],
) -> list[Action]:
    name = pdd.metadata.name
    roles: tuple[Role, ...] = ("prefill", "decode", "router")
    if p.delete:
        return [
            Delete("Deployment", names.workload(name, p.revision, r))
            for r in roles
            if f"Deployment/{names.workload(name, p.revision, r)}" in existing
        ]
    actions: list[Action] = []
    if p.revision == target.revision:
        for role in v.ENGINE_ROLES:
            manifest = engine_deployment(pdd, p.revision, role, p.replicas(role), agreement)
            change = _apply_if_changed(manifest, existing)
            if change:
                actions.append(change)
    else:
        # An old revision's template is history (the spec no longer describes it): only scale.
        for role in v.ENGINE_ROLES:
            key = f"Deployment/{names.workload(name, p.revision, role)}"
            current = existing.get(key)
            if current is None:
                continue
            was = int((current.get("spec") or {}).get("replicas") or 0)
            if was != p.replicas(role):
                actions.append(Scale(names.workload(name, p.revision, role), p.replicas(role), was))
    membership = revision_membership(
        pods,
        deployment_name=name,
        revision=p.revision,
        bootstrap_port=pdd.spec.kv_transfer.bootstrap_port,
    )
    drain = None if p.drain_until is None else format_time(p.drain_until)
    router = router_deployment(pdd, p.revision, p.router, membership, drain)
    change = _apply_if_changed(router, existing)
    if change:
        actions.append(change)
    return actions

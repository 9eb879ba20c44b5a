"""The status a reconcile writes, as the API's own status model: one builder per condition, the
per-role counts and the revision table.

`build` returns a `PDDeploymentStatus`; the shell writes its dump by alias (`as_dict`), so a field
the schema does not have cannot be written, and the schema and the writer cannot drift.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from pydantic import ValidationError

from pdmtp.api import reasons
from pdmtp.api import vocabulary as v
from pdmtp.api.status import (
    Lookahead,
    PDDeploymentStatus,
    RevisionStatus,
    RoleStatus,
    RolloutStatus,
    WaitStatus,
)
from pdmtp.api.v1alpha1 import PDDeploymentSpec, RoleSpec
from pdmtp.api.vocabulary import Role
from pdmtp.core.actions import Rejection
from pdmtp.core.agreement import Agreement
from pdmtp.core.context import Context
from pdmtp.core.objects import Obj, describe
from pdmtp.core.pods import PodIssue, Wait
from pdmtp.core.revision_state import RevisionState, RoleState
from pdmtp.core.rollout.planner import Policy, Step, Target, availability_floor
from pdmtp.core.rollout.steering import Steering
from pdmtp.core.scaling.roles import Scaling
from pdmtp.core.status.conditions import (
    ConditionUpdate,
    Transition,
    parse_conditions,
    set_conditions,
)
from pdmtp.core.verification.revisions import as_status
from pdmtp.core.verification.templates import TemplateRoll
from pdmtp.core.verification.verdict import Outcome, Verdict


def as_dict(status: PDDeploymentStatus) -> dict[str, Any]:
    """The status as written: camelCase, unset fields left out."""
    return status.model_dump(by_alias=True, exclude_none=True, mode="json")


def parse_status(raw: Obj) -> PDDeploymentStatus:
    """The stored status; what does not parse (a hand edit, an older writer) starts afresh,
    keeping the conditions that do parse so their transition times survive."""
    try:
        return PDDeploymentStatus.model_validate(raw)
    except ValidationError:
        return PDDeploymentStatus(conditions=parse_conditions(raw.get("conditions") or []))


@dataclass(frozen=True, kw_only=True)
class Findings:
    """What one reconcile found and decided, besides the spec and what it observed (`Context`):
    the status and the events are built from it in one pass (`core.status.report`)."""

    states: Sequence[RevisionState]
    step: Step
    steering: Steering
    record: RolloutStatus | None = None
    """The rollout's record (`steering.track`); None once no rollout is under way."""
    scaling: Scaling | None = None
    """The autoscaler's evaluation; None without spec.autoscaling."""
    failures: Sequence[PodIssue] = ()
    waiting: Sequence[PodIssue] = ()
    rejected: Sequence[PodIssue] = ()
    """Workloads whose pods the API server refuses."""
    waits: Sequence[Wait] = ()
    """What an unfinished step waits for, ordered (`core.pods.waits`)."""
    verdicts: Mapping[str, Verdict] = field(default_factory=dict)
    """Each revision's verdict (`core.verification`; none with spec.verification.mode Off)."""
    template_rolls: Sequence[TemplateRoll] = ()
    """The role-local changes rolling inside the spec revision (`core.verification.templates`)."""
    retired: frozenset[str] = frozenset()
    """Revisions whose workloads this reconcile deletes."""
    revision_keys: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Each revision's writes, by action key: its events claim only those applied."""


# ---- one builder per condition ------------------------------------------------------------


def config_compatible(agreement: Agreement) -> ConditionUpdate:
    if not agreement.compatible:
        first = agreement.findings[0]
        message = "; ".join(f.message for f in agreement.findings)
        return ConditionUpdate(reasons.CONFIG_COMPATIBLE, "False", first.reason, message)
    look = agreement.decode_lookahead
    detail = "both roles derive the same prefill lookahead" + (
        f" ({look}, prefill backoff {agreement.prefill_backoff})" if look is not None else ""
    )
    return ConditionUpdate(reasons.CONFIG_COMPATIBLE, "True", reasons.COMPATIBLE, detail)


def available(states: Sequence[RevisionState], target: Target, policy: Policy) -> ConditionUpdate:
    serving = [s for s in states if s.serving]
    if not serving:
        return ConditionUpdate(
            reasons.AVAILABLE,
            "False",
            reasons.NO_SERVING_REVISION,
            "no revision has a ready router with a ready prefill and decode yet",
        )
    floor = availability_floor(target, policy)
    # Capacity is what clients reach: a Ready pod its router does not list yet serves nothing.
    ready = {r: sum(s.role(r).listed for s in serving) for r in v.ENGINE_ROLES}
    serves = f"serving {ready['prefill']} prefill and {ready['decode']} decode ready pods"
    if all(ready[r] >= max(1, floor[r]) for r in v.ENGINE_ROLES):
        return ConditionUpdate(
            reasons.AVAILABLE,
            "True",
            reasons.MINIMUM_REPLICAS_AVAILABLE,
            f"{serves} through {len(serving)} revision(s)",
        )
    return ConditionUpdate(
        reasons.AVAILABLE,
        "False",
        reasons.MINIMUM_REPLICAS_UNAVAILABLE,
        f"{serves}, below the minimum {floor['prefill']} and {floor['decode']}",
    )


def _declared_minimum(spec: PDDeploymentSpec, target: Target) -> Target:
    """The counts Available is judged against: an autoscaled role's minReplicas where the
    autoscaler asks for more, so pods a scale-up adds are capacity above the declared minimum
    while they start, not missing capacity (an alert on Available would fire at every scale-up)."""
    auto = spec.autoscaling
    if auto is None:
        return target
    counts = {}
    for role in v.ENGINE_ROLES:
        scaling = auto.role(role)
        wanted = target.replicas(role)
        counts[role] = wanted if scaling is None else min(wanted, scaling.min_replicas)
    return replace(target, prefill=counts["prefill"], decode=counts["decode"])


def _progress(
    status: Literal["True", "False", "Unknown"], reason: str, message: str
) -> ConditionUpdate:
    return ConditionUpdate(reasons.PROGRESSING, status, reason, message)


def progressing(
    agreement: Agreement,
    step: Step,
    seen: Findings,
    target: Target,
    current: str | None,
    refused: Sequence[Rejection] = (),
    steering: Steering | None = None,
    record: RolloutStatus | None = None,
) -> ConditionUpdate:
    """The first that applies: a refused write, an incompatible spec, the rollout's control
    state (rollback, failure, pause, canary), completion, or what the rollout waits for."""
    if refused:
        first = refused[0]
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        return _progress(
            "False",
            reasons.CHILD_REJECTED,
            f"the API server refused {first.key} ({first.status}): {first.message}{more}",
        )
    if not agreement.compatible:
        keeps = f"; {current} keeps serving" if current else ""
        return _progress(
            "False",
            reasons.ROLLOUT_BLOCKED,
            f"the spec is incompatible: no new revision starts{keeps}",
        )
    # A rollback or a pause says more than a role-local roll held inside the revision.
    above = (steering is not None and steering.rolling_back) or step.outcome == "Paused"
    if not above and (rolled := _template_progress(seen.template_rolls)) is not None:
        return rolled
    controlled = _controlled(step, target, steering, record, seen.waits)
    if controlled is not None:
        return controlled
    if step.blocked:
        return _progress(
            "False",
            reasons.ROLLOUT_BLOCKED,
            f"rollout to {target.revision} cannot proceed: {step.reason}",
        )
    return _waiting(seen, target)


def _template_progress(rolls: Sequence[TemplateRoll]) -> ConditionUpdate | None:
    """A role-local roll held for its verdict, or one that went back."""
    for roll in rolls:
        where = f"revision {roll.revision}: the {roll.role} roll to template {roll.template}"
        if roll.held:
            return _progress(
                "True",
                reasons.AWAITING_VERDICT,
                f"{where} is held at its first new pods until they have a verdict "
                f"({roll.reason}): {roll.message}",
            )
        if roll.phase == "Failed":
            return _progress(
                "False",
                reasons.ROLLOUT_ABORTED,
                f"{where} failed its verdict; the {roll.role}s run template "
                f"{roll.verified_template}; change the role's settings to roll again",
            )
    return None


def _naming(facts: Sequence[Wait]) -> str:
    """What a message adds about the waits: nothing, or the first 3 named and the rest counted."""
    return f"; waiting for {describe(facts)}" if facts else ""


def _controlled(
    step: Step,
    target: Target,
    steering: Steering | None,
    record: RolloutStatus | None,
    facts: Sequence[Wait] = (),
) -> ConditionUpdate | None:
    """Rollback, completion, failure, pause and canary hold."""
    if steering is not None and steering.rolling_back:
        failed, back = steering.failed_revision, steering.rollback_revision
        if step.complete:
            return _progress(
                "False",
                reasons.ROLLOUT_ABORTED,
                f"rolled back to {back}: {failed} failed; change the spec to roll again",
            )
        return _progress(
            "True",
            reasons.ROLLOUT_IN_PROGRESS,
            f"rolling back from {failed} to {back}: {steering.failure}{_naming(facts)}",
        )
    if step.complete:
        return _progress(
            "False", reasons.ROLLOUT_COMPLETE, f"revision {target.revision} is fully rolled out"
        )
    if steering is not None and steering.failure is not None:
        return _progress(
            "False",
            reasons.PROGRESS_DEADLINE_EXCEEDED if steering.deadline else reasons.ROLLOUT_FAILED,
            f"rollout to {target.revision} failed: {steering.failure}",
        )
    if step.outcome == "Paused":
        return _progress(
            "Unknown",
            reasons.PAUSED,
            f"rollout to {target.revision} is paused (spec.rollout.paused); resume with "
            "`pdmtp rollout resume`",
        )
    if step.outcome == "Held":
        share = record.canary_traffic_percent if record is not None else None
        anchor = step.reason.rsplit(" ", 1)[-1]
        return _progress(
            "Unknown",
            reasons.CANARY_HOLD,
            f"canary: revision {target.revision} serves next to {anchor}"
            + (f" with {share}% of the router endpoints" if share is not None else "")
            + "; promote it with `pdmtp rollout promote`"
            + _naming(facts),
        )
    if steering is not None and steering.awaiting_verdict is not None and step.blocked:
        return _progress(
            "True",
            reasons.AWAITING_VERDICT,
            f"rolling to {target.revision}: the old revision keeps its last pods until "
            f"{target.revision} has a verdict, {steering.awaiting_verdict}",
        )
    return None


def _waiting(seen: Findings, target: Target) -> ConditionUpdate:
    """Under way: what it waits for, when something holds it up."""
    if seen.rejected:
        issue = seen.rejected[0]
        return _progress(
            "False",
            reasons.PODS_REJECTED,
            f"Deployment/{issue.pod} cannot create its pods: {issue.message}",
        )
    olds = [s.revision for s in seen.states if s.revision != target.revision]
    what = f"rolling from {', '.join(olds)} to" if olds else "scaling"
    stuck = [u for u in seen.waiting if u.revision == target.revision]
    if stuck:
        return _progress(
            "True",
            reasons.PODS_UNSCHEDULABLE,
            f"{what} {target.revision}: the scheduler cannot place {len(stuck)} of its pod(s); "
            "add capacity or allow spec.rollout.maxUnavailable so old pods make room"
            + _naming(seen.waits),
        )
    return _progress(
        "True", reasons.ROLLOUT_IN_PROGRESS, f"{what} {target.revision}{_naming(seen.waits)}"
    )


_VERDICT_STATUS: Mapping[Outcome, Literal["True", "False", "Unknown"]] = {
    Outcome.VERIFIED: "True",
    Outcome.FAILED: "False",
    Outcome.PENDING: "Unknown",
}


def verified(
    spec: PDDeploymentSpec,
    verdicts: Mapping[str, Verdict],
    update: str | None,
    steering: Steering | None = None,
    rolls: Sequence[TemplateRoll] = (),
) -> ConditionUpdate:
    """The update revision's verdict (`core.verification`); once it was rolled back for it, the
    verdict that failed it; while a role-local roll inside it is held or went back, that roll's
    (its new pods are what changed)."""
    if spec.effective_verification.mode == "Off":
        return ConditionUpdate(
            reasons.VERIFIED, "Unknown", reasons.VERIFICATION_OFF, "spec.verification.mode is Off"
        )
    verdict = verdicts.get(update) if update is not None else None
    for roll in rolls:
        if roll.revision == update and (roll.held or roll.phase == "Failed"):
            # A held roll has no verdict yet: a Verified or Failed one is not held.
            said: Literal["False", "Unknown"] = "False" if roll.phase == "Failed" else "Unknown"
            return ConditionUpdate(
                reasons.VERIFIED, said, roll.reason or reasons.NO_METRICS,
                f"revision {update}: {roll.message}",
            )  # fmt: skip
    if (
        steering is not None
        and steering.failed_verdict is not None
        and steering.failed_revision == update
        and (verdict is None or verdict.outcome != Outcome.FAILED)
    ):
        return ConditionUpdate(
            reasons.VERIFIED,
            "False",
            steering.failed_verdict,
            f"revision {update} failed its verdict and was rolled back: {steering.failure}",
        )
    if verdict is None:
        return ConditionUpdate(
            reasons.VERIFIED,
            "Unknown",
            reasons.NO_METRICS,
            f"revision {update} has no decode pods yet" if update else "no revision yet",
        )
    status = _VERDICT_STATUS[verdict.outcome]
    return ConditionUpdate(
        reasons.VERIFIED, status, verdict.finding.value, f"revision {update}: {verdict.message}"
    )


def degraded(failures: Sequence[PodIssue], steering: Steering | None = None) -> ConditionUpdate:
    if steering is not None and steering.failed_revision is not None:
        return ConditionUpdate(
            reasons.DEGRADED,
            "True",
            reasons.ROLLED_BACK,
            f"revision {steering.failed_revision} failed and was rolled back; "
            f"{steering.rollback_revision} serves: {steering.failure}",
        )
    if not failures:
        return ConditionUpdate(
            reasons.DEGRADED,
            "False",
            reasons.AS_EXPECTED,
            "no engine container has terminated with an error",
        )
    f = failures[0]
    refused = f.exit_code == v.LAUNCHER_REFUSED_EXIT_CODE
    return ConditionUpdate(
        reasons.DEGRADED,
        "True",
        reasons.ENGINE_REFUSED_CONFIG if refused else reasons.ENGINE_TERMINATED,
        f"{f.role} pod {f.pod} (revision {f.revision}) exited {f.exit_code}: {f.message}"
        + (f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""),
    )


# ---- counts -----------------------------------------------------------------------------------


def _role_of(state: RevisionState, role: Role) -> RoleState:
    return state.router if role == "router" else state.role(role)


def role_counts(
    states: Sequence[RevisionState],
    spec: PDDeploymentSpec,
    update: str | None,
    scaled: Mapping[v.EngineRole, int] | None = None,
) -> list[RoleStatus]:
    """Per role: pods, Ready, updated, and the count asked for (the autoscaler's, if any)."""
    desired: dict[str, int] = {"prefill": spec.prefill.replicas, "decode": spec.decode.replicas}
    for role, count in (scaled or {}).items():
        desired[role] = count
    desired["router"] = spec.router.replicas
    return [
        RoleStatus(
            name=role,
            replicas=sum(_role_of(s, role).pods for s in states),
            ready_replicas=sum(_role_of(s, role).ready for s in states),
            updated_replicas=sum(_role_of(s, role).ready for s in states if s.revision == update),
            desired_replicas=desired[role],
            pods_per_replica=None if role == "router" else _group_size(spec.role(role)),
        )
        for role in v.ROLES
    ]


def _group_size(role: RoleSpec) -> int | None:
    return None if role.multi_node is None else role.multi_node.nodes


def phase(state: RevisionState) -> Literal["Starting", "Serving", "Draining", "Retired"]:
    if state.serving:
        return "Serving"
    if state.draining:
        return "Draining"
    if state.routed or state.prefill.replicas or state.decode.replicas:
        return "Starting"
    return "Retired"


def revision_table(
    states: Sequence[RevisionState], verdicts: Mapping[str, Verdict] | None = None
) -> list[RevisionStatus]:
    judged = verdicts or {}
    return [
        RevisionStatus(
            revision=s.revision,
            phase=phase(s),
            prefill=f"{s.prefill.ready}/{s.prefill.replicas}",
            decode=f"{s.decode.ready}/{s.decode.replicas}",
            routers=s.router.ready,
            verification=as_status(judged[s.revision]) if s.revision in judged else None,
        )
        for s in states
    ]


# ---- the whole status -------------------------------------------------------------------------


def current_revision(states: Sequence[RevisionState], old: PDDeploymentStatus) -> str | None:
    """The most established serving revision; while none serves, the last one that did, if it
    still has workloads."""
    serving = [s for s in states if s.serving]
    if serving:
        return serving[0].revision
    if any(s.revision == old.current_revision for s in states):
        return old.current_revision
    return None


def build(
    ctx: Context, seen: Findings, refused: Sequence[Rejection] = ()
) -> tuple[PDDeploymentStatus, list[Transition]]:
    """The status for this reconcile (after its writes; `refused` are those the API server
    refused) and the conditions that flipped."""
    spec, generation, old, agreement = ctx.spec, ctx.generation, ctx.old, ctx.agreement
    steering, record, scaling = seen.steering, seen.record, seen.scaling
    target, policy, now = steering.target, steering.policy, ctx.stamp
    update = steering.spec_revision or old.update_revision
    current = current_revision(seen.states, old)
    updates = [
        config_compatible(agreement),
        available(seen.states, _declared_minimum(spec, target), policy),
        progressing(agreement, seen.step, seen, target, current, refused, steering, record),
        degraded(seen.failures, steering),
        verified(spec, seen.verdicts, update, steering, seen.template_rolls),
    ]
    conditions, transitions = set_conditions(old.conditions, updates, generation, now)
    roles = role_counts(seen.states, spec, update, None if scaling is None else scaling.desired)
    waiting = None if seen.step.complete else waiting_for(seen.waits)
    status = PDDeploymentStatus(
        observed_generation=generation,
        lookahead=Lookahead(
            prefill=agreement.prefill_lookahead,
            decode=agreement.decode_lookahead,
            prefill_backoff=agreement.prefill_backoff,
        ),
        current_revision=current,
        update_revision=update,
        rollout=record,
        prefill=f"{roles[0].ready_replicas}/{roles[0].desired_replicas}",
        decode=f"{roles[1].ready_replicas}/{roles[1].desired_replicas}",
        roles=roles,
        autoscaling=None if scaling is None else scaling.status,
        waiting_for=waiting,
        revisions=revision_table(seen.states, seen.verdicts),
        template_rolls=[r.as_status() for r in seen.template_rolls] or None,
        conditions=conditions,
    )
    return status, transitions


WAITING_FOR_LIMIT = 10
"""At most this many facts in status.waitingFor (the schema's bound)."""


def waiting_for(facts: Sequence[Wait]) -> list[WaitStatus] | None:
    """status.waitingFor: the first facts, or None when nothing waits."""
    return [
        WaitStatus(
            object=w.object,
            revision=w.revision,
            role=w.role,
            reason=w.reason,
            message=w.message,
            stuck=w.stuck,
        )
        for w in facts[:WAITING_FOR_LIMIT]
    ] or None


def unusable(
    old: PDDeploymentStatus,
    generation: int | None,
    message: str,
    now: str,
    reason: str = reasons.INVALID_SPEC,
) -> tuple[PDDeploymentStatus, list[Transition]]:
    """A spec that cannot be served (it does not parse, or the cluster lacks what it needs): say
    so, and leave the rest of the status as it was."""
    update = ConditionUpdate(reasons.CONFIG_COMPATIBLE, "False", reason, message)
    conditions, transitions = set_conditions(old.conditions, [update], generation, now)
    status = old.model_copy(update={"observed_generation": generation, "conditions": conditions})
    return status, transitions

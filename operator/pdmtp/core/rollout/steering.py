"""Rollout control around the planner: pause, canary hold and promotion, the progress deadline,
automatic rollback. Pure: what to aim for this reconcile, and where the rollout stands.

`steer` decides the planner's target and policy from the spec, what is observed and the
rollout status the operator wrote last time (the deadline's clock and a remembered failure live
there, as a Deployment keeps its own in its Progressing condition):

- a failure of the spec's revision (an engine refusing its config, a crash loop, no progress for
  progressDeadlineSeconds) while an older revision serves: with `onFailure: Rollback` the target
  becomes that revision (the most established one) and the failed revision is remembered in the
  status, so it is not retried until the spec changes; with `Hold` the rollout stays where it
  is and says so;
- a verdict (`core.verification`): a new revision found Failed while an older one serves fails
  as above; in the modes that act (Rollback, Gate) the old revision keeps its last pods until the
  new one has a verdict (`Policy.verifying`), whatever the replica counts; a verdict not reached
  by the deadline fails the rollout under Gate, and under Rollback lets it go on unverified
  (remembered in the status, `verdictWaived`, until the spec changes);
- `paused` freezes the planner; a `canary` holds the new revision at its share until the
  PDDeployment carries the `pdmtp.io/promote: <revision>` annotation (or, with autoPromote,
  until the new revision is Verified). Promotion by hand also releases a verdict's hold.

`track` turns the step into the status's rollout record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from pdmtp.api import vocabulary as v
from pdmtp.api.status import RolloutPhase, RolloutStatus
from pdmtp.api.v1alpha1 import PDDeploymentSpec
from pdmtp.core.agreement import Agreement
from pdmtp.core.context import Context
from pdmtp.core.objects import describe, format_time, labels_of, parse_time
from pdmtp.core.pods import (
    PodIssue,
    Wait,
    crash_looping,
    engine_failures,
    unschedulable,
    waits,
)
from pdmtp.core.revision import revision_of
from pdmtp.core.revision_state import Gate, RevisionState, establishment
from pdmtp.core.rollout.planner import Policy, Step, Target


@dataclass(frozen=True)
class Steering:
    """What the planner aims for this time, and why."""

    target: Target
    policy: Policy
    spec_revision: str | None
    failed_revision: str | None = None
    failed_generation: int | None = None
    rollback_revision: str | None = None
    failure: str | None = None
    """Why the spec's revision failed (now or earlier); None while it has not."""
    failed_verdict: str | None = None
    """The verdict's reason, when the failure is the revision's verdict (`core.verification`)."""
    new_failure: bool = False
    """The failure was found in this reconcile (worth an event)."""
    deadline: bool = False
    """The failure is the progress deadline (else an engine's refusal or crash loop)."""
    promoted: bool = False
    """A canary hold was released by promotion in this reconcile."""
    awaiting_verdict: str | None = None
    """Why the old revision keeps its last pods (awaiting the new one's verdict); None if free."""
    verdict_waived: str | None = None
    """Why the rollout goes on without a verdict (mode Rollback, none by the deadline)."""
    new_waiver: bool = False
    """The verdict was waived in this reconcile (worth an event)."""
    template_held: bool = False
    """A role-local roll inside the revision is held for its own verdict, which keeps its own
    deadline (`core.verification.templates`): the rollout's clock does not run meanwhile."""

    @property
    def rolling_back(self) -> bool:
        return self.rollback_revision is not None


@dataclass(frozen=True)
class PodHealth:
    """What is wrong with pods (`core.pods`)."""

    failures: Sequence[PodIssue] = ()
    crash_looping: Sequence[PodIssue] = ()
    waiting: Sequence[PodIssue] = ()
    waits: Sequence[Wait] = ()
    """What an unfinished step waits for, every revision and role (`core.pods.waits`)."""
    verification: Gate = field(default_factory=Gate)
    """What the spec revision's verdict does to its rollout (`revisions.rollout_gate`)."""


def pod_health(ctx: Context, gate: Gate) -> PodHealth:
    """What is wrong with the pods, what the step waits for, and (`gate`) what the spec
    revision's verdict does to its rollout."""
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
        gate,
    )


def target_and_policy(agreement: Agreement) -> tuple[Target, Policy]:
    """What the planner aims for and the rules it keeps; no target revision when incompatible."""
    eff = agreement.settings
    revision = revision_of(eff) if agreement.compatible else None
    target = Target(revision, eff.prefill.replicas, eff.decode.replicas, eff.router.replicas)
    rollout = eff.rollout
    return target, Policy(rollout.max_surge, rollout.max_unavailable, rollout.drain_seconds)


def steer(
    ctx: Context,
    target: Target,
    policy: Policy,
    states: Sequence[RevisionState],
    health: PodHealth,
    template_held: bool = False,
) -> Steering:
    """Where this reconcile rolls to: the spec's `target`, or back to the revision that serves
    when the rollout failed (deadline, engines, verdict) under `onFailure: Rollback`; held for
    a canary, a pause or a verdict still awaited."""
    spec, old, now, generation = ctx.spec, ctx.old.rollout, ctx.now, ctx.generation
    revision = target.revision
    if revision is None:
        return Steering(target, policy, None)
    anchor = _anchor(states, revision)
    same_spec = old is not None and old.failed_generation == generation
    back = (
        old.rollback_revision
        if old is not None and old.failed_revision == revision and same_spec
        else None
    )
    if back is not None and any(s.revision == back for s in states):
        # Rolled back before: stay there until the spec changes.
        assert old is not None
        return Steering(
            replace(target, revision=back),
            policy,
            revision,
            failed_revision=revision,
            failed_generation=generation,
            rollback_revision=back,
            failure=old.failure,
            failed_verdict=old.failed_verdict,
        )
    failure, deadline = failure_of(revision, spec, health, old, now, states)
    if template_held and deadline:
        failure, deadline = None, False  # the held roll's own deadline decides
    overdue = _overdue(revision, spec, old, now) and not template_held
    waiting_only = _held_for_verdict(revision, health.verification, states)
    waived, new_waiver = _waiver(revision, health.verification, old, overdue and waiting_only, spec)
    failed_verdict = None
    if failure is None and anchor is not None:
        # A verdict is a rollout's failure only while an older revision serves beside it.
        failure, failed_verdict = health.verification.failure, health.verification.finding
    if failure is not None and spec.rollout.on_failure == "Rollback" and anchor is not None:
        return Steering(
            replace(target, revision=anchor),
            policy,
            revision,
            failed_revision=revision,
            failed_generation=generation,
            rollback_revision=anchor,
            failure=failure,
            failed_verdict=failed_verdict,
            new_failure=True,
            deadline=deadline,
        )
    canary = spec.rollout.canary
    by_hand = ctx.promoted == revision
    verified = canary is not None and canary.auto_promote and health.verification.verified
    held = canary is not None and not by_hand and not verified
    released = canary is not None and not held and old is not None and old.phase == "CanaryHold"
    # The user's promotion overrides the verdict, as it does the canary hold; so does a verdict
    # waived at the deadline.
    free = by_hand or anchor is None or waived is not None
    awaiting = None if free else health.verification.awaiting
    steered = replace(
        policy,
        paused=spec.rollout.paused,
        canary_percent=canary.percent if canary is not None and held else None,
        verifying=awaiting is not None,
    )
    return Steering(
        target,
        steered,
        revision,
        failure=failure,
        failed_verdict=failed_verdict,
        promoted=released,
        deadline=deadline,
        awaiting_verdict=awaiting,
        verdict_waived=waived,
        new_waiver=new_waiver,
        template_held=template_held,
    )


def _overdue(revision: str, spec: PDDeploymentSpec, old: RolloutStatus | None, now: float) -> bool:
    """The rollout to `revision` made no progress for progressDeadlineSeconds."""
    if old is None or old.revision != revision or old.phase not in ("Progressing", "Failed"):
        return False
    since = parse_time(old.last_progress_at)
    return since is not None and now - since > spec.rollout.progress_deadline_seconds


def _waiver(
    revision: str, gate: Gate, old: RolloutStatus | None, overdue: bool, spec: PDDeploymentSpec
) -> tuple[str | None, bool]:
    """Why the rollout to `revision` goes on without a verdict (None: it does not), and whether
    that was decided now: under mode Rollback, a hold for a verdict that did not come within
    progressDeadlineSeconds (`overdue`: the roll waited for nothing else) ends, once and for
    this spec."""
    if old is not None and old.revision == revision and old.verdict_waived is not None:
        return old.verdict_waived, False
    if not (gate.release_at_deadline and overdue):
        return None, False
    deadline = spec.rollout.progress_deadline_seconds
    return f"no verdict within {deadline}s ({gate.awaiting}); going on unverified", True


def _held_for_verdict(revision: str, gate: Gate, states: Sequence[RevisionState]) -> bool:
    """The rollout to `revision` waits for nothing but its verdict: every pod it was given is
    Ready. A revision whose pods never came up has made no progress, verdict or not (a missing
    verdict must not waive an image that cannot be pulled)."""
    state = next((s for s in states if s.revision == revision), None)
    if gate.awaiting is None or state is None:
        return False
    return all(r.ready >= r.replicas for r in (state.prefill, state.decode))


def _anchor(states: Sequence[RevisionState], revision: str) -> str | None:
    """The most established revision that serves, other than `revision`."""
    serving = [s for s in states if s.serving and s.revision != revision]
    return max(serving, key=establishment).revision if serving else None


def failure_of(
    revision: str,
    spec: PDDeploymentSpec,
    health: PodHealth,
    old: RolloutStatus | None,
    now: float,
    states: Sequence[RevisionState],
) -> tuple[str | None, bool]:
    """Why `revision` has failed (None: it has not), and whether it is the deadline."""
    refused = [
        f
        for f in health.failures
        if f.revision == revision and f.exit_code == v.LAUNCHER_REFUSED_EXIT_CODE
    ]
    if refused:
        f = refused[0]
        return f"the engine refused its config ({f.role} pod {f.pod}): {f.message}", False
    crashing = [c for c in health.crash_looping if c.revision == revision]
    if crashing:
        c = crashing[0]
        return f"{c.role} pod {c.pod} is crash-looping: {c.message}", False
    if not _overdue(revision, spec, old, now):
        return None, False
    deadline = spec.rollout.progress_deadline_seconds
    gate = health.verification
    if _held_for_verdict(revision, gate, states):
        if gate.release_at_deadline:
            return None, False  # the verdict is waived instead (`_waiver`)
        return f"not Verified within {deadline}s: {gate.awaiting}", True
    return f"no progress for {deadline}s: {stall_cause(revision, spec, health, states)}", True


def stall_cause(
    revision: str, spec: PDDeploymentSpec, health: PodHealth, states: Sequence[RevisionState]
) -> str:
    """What a stalled rollout waits for, with the policy that would work where it can tell, and
    the objects it waits for in every revision and role (routers, the old revision's pods)."""
    stuck = [u for u in health.waiting if u.revision == revision]
    said = {f"Pod/{stuck[0].pod}"} if stuck else set()
    others = [w for w in health.waits if w.object not in said]
    named = f"; waiting for {describe(others)}" if others else ""
    return _stalled(revision, spec, health, states) + named


def _stalled(
    revision: str, spec: PDDeploymentSpec, health: PodHealth, states: Sequence[RevisionState]
) -> str:
    stuck = [u for u in health.waiting if u.revision == revision]
    if stuck:
        rollout = spec.rollout
        advice = ""
        if rollout.max_surge > 0 and "Insufficient" in stuck[0].message:
            advice = (
                "; the cluster has no room for surge pods: maxSurge: 0 with maxUnavailable: 1 "
                "replaces old pods in place, one at a time"
            )
        return (
            f"the scheduler cannot place {len(stuck)} pod(s) ({stuck[0].role} {stuck[0].pod}: "
            f"{stuck[0].message}){advice}"
        )
    state = next((s for s in states if s.revision == revision), None)
    if state is None:
        return "the new revision has no pods"
    return (
        f"ready pods of {revision}: prefill {state.prefill.ready}/{state.prefill.replicas}, "
        f"decode {state.decode.ready}/{state.decode.replicas}"
    )


def track(
    old: RolloutStatus | None,
    steering: Steering,
    step: Step,
    states: Sequence[RevisionState],
    now: float,
    canary_share: int | None,
) -> RolloutStatus | None:
    """The rollout record: what it is doing, and when it last moved (the deadline's clock)."""
    revision = steering.spec_revision
    if revision is None:
        return old
    stamp = format_time(now)
    marker = "; ".join(
        f"{s.revision} P{s.prefill.ready}/{s.prefill.pods} D{s.decode.ready}/{s.decode.pods} "
        f"R{s.router.ready}"
        for s in states
    )
    phase = _phase(steering, step)
    fresh = old is None or old.revision != revision
    # The clock runs only while Progressing; entering a phase (resume, promotion) restarts it.
    moved = (
        fresh
        or marker != old.progress  # type: ignore[union-attr]
        or phase != old.phase  # type: ignore[union-attr]
        or steering.template_held
    )
    if phase == "Progressing" and steering.failure is not None:
        phase = "Failed"  # Hold: the rollout stays where it is, the clock stops
        moved = False
    return RolloutStatus(
        revision=revision,
        phase=phase,
        started_at=stamp if fresh or old is None else old.started_at,
        last_progress_at=stamp if moved or old is None else old.last_progress_at,
        progress=marker,
        failure=steering.failure,
        failed_verdict=steering.failed_verdict,
        failed_revision=steering.failed_revision,
        failed_generation=steering.failed_generation,
        rollback_revision=steering.rollback_revision,
        canary_traffic_percent=canary_share if phase == "CanaryHold" else None,
        verdict_waived=steering.verdict_waived,
    )


def _phase(steering: Steering, step: Step) -> RolloutPhase:
    if steering.rolling_back:
        return "RolledBack" if step.complete else "RollingBack"
    if step.complete:
        return "Complete"
    if step.outcome == "Paused":
        return "Paused"
    if step.outcome == "Held":
        return "CanaryHold"
    return "Progressing"


def canary_traffic(states: Sequence[RevisionState], revision: str | None) -> int | None:
    """The new revision's share of ready router endpoints, in percent (what clients get)."""
    serving = [s for s in states if s.serving]
    total = sum(s.router.ready for s in serving)
    mine = sum(s.router.ready for s in serving if s.revision == revision)
    return round(100 * mine / total) if total else None

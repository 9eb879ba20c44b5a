"""core.rollout: when a rollout fails, rolls back, holds, pauses or is promoted; the deadline's
clock in the status's rollout record."""

from __future__ import annotations

from typing import Any

from builders import PDDBuilder, pdd
from pdmtp.api.status import PDDeploymentStatus, RolloutStatus
from pdmtp.core.agreement import check
from pdmtp.core.context import Context
from pdmtp.core.objects import format_time
from pdmtp.core.pods import PodIssue
from pdmtp.core.revision_state import RevisionState, RoleState
from pdmtp.core.rollout.planner import Step
from pdmtp.core.rollout.steering import PodHealth, Steering, steer, target_and_policy, track

NOW = 1_800_000_000.0
HEALTHY = PodHealth()
OLD = RevisionState("old", RoleState(2, 2, 2), RoleState(2, 2, 2), RoleState(1, 1, 1), created=1)


def steering(
    b: PDDBuilder,
    states: list[RevisionState],
    health: PodHealth = HEALTHY,
    old: RolloutStatus | None = None,
    now: float = NOW,
    promoted: str | None = None,
    generation: int = 1,
) -> Steering:
    built = b.build()
    agreement = check(built.spec)
    target, policy = target_and_policy(agreement)
    ctx = Context(
        pdd=built,
        agreement=agreement,
        generation=generation,
        old=PDDeploymentStatus(rollout=old),
        now=now,
        stamp=format_time(now),
        promoted=promoted,
    )
    return steer(ctx, target, policy, states, health)


def new_state(b: PDDBuilder, ready: int = 0) -> RevisionState:
    rev = target_and_policy(check(b.build().spec))[0].revision
    assert rev is not None
    return RevisionState(rev, RoleState(1, 1, ready), RoleState(1, 1, ready), created=5)


def refused(revision: str) -> PodHealth:
    return PodHealth(failures=[PodIssue("p-0", revision, "prefill", "lookahead mismatch", 3)])


def record(revision: str, phase: Any, since: float, **extra: Any) -> RolloutStatus:
    stamp = format_time(since)
    return RolloutStatus(
        revision=revision,
        phase=phase,
        started_at=stamp,
        last_progress_at=stamp,
        progress="x",
        **extra,
    )


def test_a_refusal_rolls_back_to_the_serving_revision() -> None:
    b = pdd("x").mtp(2, modules=3)
    new = new_state(b)
    s = steering(b, [OLD, new], refused(new.revision))
    assert s.rolling_back and s.new_failure and not s.deadline
    assert (s.target.revision, s.failed_revision, s.rollback_revision) == (
        "old",
        new.revision,
        "old",
    )
    assert (s.target.prefill, s.target.decode) == (1, 1), "the spec's replicas, on the old revision"
    assert "lookahead mismatch" in (s.failure or "")


def test_hold_or_nothing_older_keeps_the_target() -> None:
    b = pdd("x").mtp(2, modules=3).rollout(onFailure="Hold")
    new = new_state(b)
    s = steering(b, [OLD, new], refused(new.revision))
    assert not s.rolling_back and s.failure and s.target.revision == new.revision
    b = pdd("x").mtp(2, modules=3)
    s = steering(b, [new], refused(new.revision))
    assert not s.rolling_back and s.failure is not None


def test_rolled_back_stays_until_the_spec_changes() -> None:
    b = pdd("x").mtp(2, modules=3)
    new = new_state(b)
    gone = record(
        new.revision,
        "RolledBack",
        NOW,
        failed_revision=new.revision,
        failed_generation=2,
        rollback_revision="old",
        failure="refused",
    )
    s = steering(b, [OLD], old=gone, generation=2)
    assert s.rolling_back and not s.new_failure and s.failure == "refused"
    s = steering(b, [OLD], old=gone, generation=3)
    assert not s.rolling_back and s.target.revision == new.revision


def test_the_deadline_counts_from_the_last_progress() -> None:
    b = pdd("x").mtp(2, modules=3).rollout(progressDeadlineSeconds=60)
    new = new_state(b)
    waiting = PodHealth(
        waiting=[PodIssue("p-0", new.revision, "decode", "0/4 nodes: Insufficient nvidia.com/gpu")]
    )
    ok = steering(b, [OLD, new], waiting, record(new.revision, "Progressing", NOW - 59))
    assert ok.failure is None
    late = steering(b, [OLD, new], waiting, record(new.revision, "Progressing", NOW - 61))
    assert late.rolling_back and late.deadline
    assert "Insufficient" in (late.failure or "") and "maxSurge: 0 with maxUnavailable: 1" in (
        late.failure or ""
    )
    paused = steering(b, [OLD, new], waiting, record(new.revision, "Paused", NOW - 3600))
    assert paused.failure is None, "no deadline while paused"


def test_canary_holds_until_the_revision_is_promoted() -> None:
    b = pdd("x").mtp(2, modules=3).rollout(canary={"percent": 25}, paused=True)
    new = new_state(b)
    held = steering(b, [OLD, new])
    assert held.policy.canary_percent == 25 and held.policy.paused
    promoted = steering(
        b, [OLD, new], old=record(new.revision, "CanaryHold", NOW), promoted=new.revision
    )
    assert promoted.policy.canary_percent is None and promoted.promoted
    other = steering(b, [OLD, new], promoted="someone-else")
    assert other.policy.canary_percent == 25


def test_track_moves_the_clock_only_on_progress_or_a_new_phase() -> None:
    b = pdd("x").mtp(2, modules=3)
    new = new_state(b)
    s = steering(b, [OLD, new])
    step = Step((), "Progress")
    first = track(None, s, step, [OLD, new], NOW, None)
    assert (
        first is not None
        and first.phase == "Progressing"
        and first.last_progress_at == format_time(NOW)
    )
    same = track(first, s, step, [OLD, new], NOW + 30, None)
    assert same is not None and same.last_progress_at == format_time(NOW)
    moved = track(first, s, step, [OLD, new_state(b, ready=1)], NOW + 31, None)
    assert moved is not None and moved.last_progress_at == format_time(NOW + 31)
    assert moved.started_at == format_time(NOW)

"""core.verification and its effect on a rollout: each revision's verdict from its decode pods'
scrapes, what the spec's mode makes of the update revision's verdict, and how `steer` and the
planner act on it (rollback on Failed, the old revision held and a canary promoted by itself
under Gate, the user's promotion overriding)."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
from builders import PDDBuilder, compat_revision, pdd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pdmtp.api import reasons
from pdmtp.api import vocabulary as v
from pdmtp.api.status import Condition, PDDeploymentStatus
from pdmtp.api.v1alpha1 import PDDeployment, VerificationSpec
from pdmtp.core.agreement import check
from pdmtp.core.context import Context
from pdmtp.core.objects import format_time
from pdmtp.core.promtext import Scrape
from pdmtp.core.reconcile import Decision
from pdmtp.core.revision_state import RevisionState, RoleState
from pdmtp.core.rollout.invariants import InvariantMonitor
from pdmtp.core.rollout.planner import Policy, Target
from pdmtp.core.rollout.steering import PodHealth, steer, target_and_policy
from pdmtp.core.status.events import condition_events
from pdmtp.core.verification.revisions import (
    expected_backoff,
    load_failure_policy,
    rollout_gate,
    verdicts,
)
from pdmtp.core.verification.verdict import Finding, Handoff, Outcome, Verdict
from pdmtp.core.windows import PodMetrics
from pdmtp.tools.simulate import SimCluster, simulate_rollout
from rollout_strategies import policies, targets

from tests.support.fake_cluster import FakeCluster

NOW = 1_800_000_000.0
OLD = RevisionState("old", RoleState(2, 2, 2), RoleState(2, 2, 2), RoleState(1, 1, 1), created=1)


def decode_pod(
    name: str, revision: str, backoff: int | None = 2, rank: str | None = None, k: int = 3
) -> Any:
    labels = {v.LABEL_REVISION: revision, v.LABEL_ROLE: "decode"}
    if rank is not None:
        labels[v.LABEL_GROUP_RANK] = rank
    env = [] if backoff is None else [{"name": v.ENV_EXPECTED_BACKOFF, "value": str(backoff)}]
    drafting = f'{{"method":"mtp","num_speculative_tokens":{k}}}'
    args = ["--port", "8000", "--speculative-config", drafting]
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "engine", "env": env, "args": args}]},
    }


def scrape(
    requests: float,
    backoff: float,
    *,
    failed: float = 0,
    drafts: float = 0,
    accepted: float = 0,
    decode_only: float = 0,
) -> PodMetrics:
    """A decode's first scrape: one window, its counts since the engine started."""
    return PodMetrics().scraped(
        Scrape(
            NOW,
            kv_pulled_requests=requests,
            kv_pulled_tokens=requests * 100,
            kv_backoff_tokens=backoff,
            kv_decode_only_requests=decode_only,
            failed_recvs=failed,
            drafts=drafts,
            accepted_tokens=accepted,
        )
    )


def steady(
    count: int, requests: float, backoff: float, drafts: float, accepted: float
) -> PodMetrics:
    """A decode scraped every 15 s, `count` times, ending at NOW: each window `requests` pulls,
    `drafts` drafts and about `accepted` accepted tokens (5 % either way, window by window)."""
    held = PodMetrics()
    for i in range(count):
        n = i + 1
        held = held.scraped(
            Scrape(
                NOW - 15 * (count - n),
                kv_pulled_requests=requests * n,
                kv_pulled_tokens=requests * 100 * n,
                kv_backoff_tokens=backoff * n,
                kv_decode_only_requests=0,
                failed_recvs=0,
                drafts=drafts * n,
                accepted_tokens=accepted * n + (0.05 * accepted if n % 2 else 0),
            )
        )
    return held


def state(revision: str, created: float, routed: bool = True) -> RevisionState:
    router = RoleState(1, 1, 1) if routed else RoleState()
    return RevisionState(revision, RoleState(1, 1, 1), RoleState(1, 1, 1), router, created=created)


def test_each_revision_is_judged_on_its_own_decodes_against_the_serving_one() -> None:
    states = [state("old", 1), state("new", 5)]
    pods = [decode_pod("o-0", "old"), decode_pod("n-0", "new"), decode_pod("n-1", "new")]
    metrics = {
        "o-0": steady(12, 4, 8, drafts=100, accepted=150),
        "n-0": steady(10, 1, 2, drafts=50, accepted=40),
        "n-1": steady(10, 1, 2, drafts=50, accepted=40),
    }
    judged = verdicts(VerificationSpec(), states, pods, metrics, "new")
    assert judged["old"].outcome == Outcome.VERIFIED
    # 0.8 accepted per draft against the serving revision's 1.5: regressed.
    assert judged["new"].finding == Finding.ACCEPTANCE_REGRESSED, judged["new"].message
    assert judged["new"].handoff.reporting_pods == 2 and judged["new"].handoff.requests == 20
    assert judged["new"].expected_backoff == 2
    assert "against the serving revision's 1.49" in judged["new"].message
    # The same drafts as the serving revision's: Verified.
    metrics |= {n: steady(10, 1, 2, drafts=50, accepted=75) for n in ("n-0", "n-1")}
    assert verdicts(VerificationSpec(), states, pods, metrics, "new")["new"].outcome == (
        Outcome.VERIFIED
    )
    assert verdicts(VerificationSpec(mode="Off"), states, pods, metrics) == {}


def test_the_serving_revision_is_judged_on_its_recent_failures() -> None:
    """A prefill crashed an hour ago cost the decode 3 of its first 5 pulls: once clean windows
    follow, the serving revision is Verified again; failures in its last windows fail it. A new
    revision beside it answers for every failure since it started, against the serving
    revision's over the same span: a shared blip fails neither, ten times the rate fails it."""
    states = [state("old", 1), state("new", 5)]
    pods = [decode_pod("o-0", "old"), decode_pod("n-0", "new")]

    def history(*failed: float, requests: float = 5) -> PodMetrics:
        """Scrapes 15 s apart; `failed` is the failed receives' counter at each."""
        held = PodMetrics()
        for i, f in enumerate(failed):
            n = i + 1
            at = NOW - 15 * (len(failed) - n)
            held = held.scraped(
                Scrape(
                    at,
                    kv_pulled_requests=requests * n,
                    kv_backoff_tokens=requests * n * 2,
                    kv_decode_only_requests=0,
                    failed_recvs=f,
                )
            )
        return held

    recovered = {"o-0": history(0, 3, 3, 3, 3, 3, 3), "n-0": history(0, 3, 3, 3, 3, 3, 3)}
    judged = verdicts(VerificationSpec(), states, pods, recovered, "new")
    assert judged["old"].outcome == Outcome.VERIFIED, judged["old"].message
    assert judged["old"].handoff.failed == 0  # its last 4 windows
    assert judged["new"].outcome == Outcome.VERIFIED, judged["new"].message
    assert judged["new"].handoff.failed == 3  # every window since it started
    tenfold = {
        "o-0": history(*[0] * 7, requests=20),
        "n-0": history(*[4 * n for n in range(1, 8)], requests=20),
    }
    judged = verdicts(VerificationSpec(), states, pods, tenfold, "new")
    assert judged["new"].finding == Finding.LOAD_FAILED, judged["new"].message
    assert "a rate well above the serving revision's (0 of" in judged["new"].message
    failing = verdicts(VerificationSpec(), states, pods, {"o-0": history(0, 0, 0, 3, 6, 9)}, "new")
    assert failing["old"].finding == Finding.LOAD_FAILED
    assert failing["old"].handoff.failed == 9
    # Alone, it is the serving revision too.
    alone = verdicts(VerificationSpec(), [state("old", 1)], pods[:1], recovered, "old")
    assert alone["old"].outcome == Outcome.VERIFIED


def test_the_failure_policy_judged_is_the_one_each_revisions_pods_were_started_with() -> None:
    recompute = decode_pod("n-0", "new")
    config = '{"kv_connector":"BackoffMooncakeConnector","kv_load_failure_policy":"recompute"}'
    recompute["spec"]["containers"][0]["args"] += ["--kv-transfer-config", config]
    # Alone, it is judged on its recent windows: a first scrape opens them, the second counts.
    first = Scrape(NOW - 15, kv_pulled_requests=0, kv_backoff_tokens=0, failed_recvs=0)
    metrics = {
        "n-0": PodMetrics()
        .scraped(first)
        .scraped(replace(first, at=NOW, kv_pulled_requests=4, kv_backoff_tokens=8, failed_recvs=3))
    }
    judged = verdicts(VerificationSpec(), [state("new", 1)], [recompute], metrics, "new")
    assert judged["new"].finding == Finding.PULL_FAILED
    assert load_failure_policy([recompute]) == "recompute"
    assert load_failure_policy([decode_pod("x", "new")]) == "fail"  # vLLM's default


def test_acceptance_is_compared_only_between_revisions_that_draft_alike() -> None:
    """Fewer drafted tokens accept fewer per draft: k 3 -> 2 is no regression; the spec's
    expectedAcceptanceLength is the reference then, where given."""
    states = [state("old", 1), state("new", 5)]
    pods = [decode_pod("o-0", "old"), decode_pod("n-0", "new", backoff=1, k=2)]
    metrics = {
        "o-0": steady(10, 2, 4, drafts=100, accepted=210),
        "n-0": steady(10, 1, 1, drafts=100, accepted=140),
    }
    judged = verdicts(VerificationSpec(), states, pods, metrics, "new")["new"]
    assert judged.outcome == Outcome.VERIFIED, judged.message
    expecting = VerificationSpec(expected_acceptance_length=2.0)
    judged = verdicts(expecting, states, pods, metrics, "new")["new"]
    assert judged.finding == Finding.ACCEPTANCE_REGRESSED


def test_the_backoff_judged_is_the_one_each_revisions_pods_were_started_with() -> None:
    """An old revision rendered for a lookahead of 3 recomputes 3 per request: it is not held to
    the spec's new lookahead."""
    states = [state("old", 1), state("new", 5)]
    pods = [decode_pod("o-0", "old", backoff=3), decode_pod("n-0", "new", backoff=2)]
    metrics = {"o-0": scrape(10, 30), "n-0": scrape(10, 30)}
    judged = verdicts(VerificationSpec(), states, pods, metrics)
    assert judged["old"].outcome == Outcome.VERIFIED
    assert judged["new"].finding == Finding.BACKOFF_MISMATCH
    assert expected_backoff([decode_pod("x", "new", backoff=None)]) is None


def test_a_multi_node_group_reports_through_its_leader_only() -> None:
    pods = [decode_pod("g-0", "new", rank="0"), decode_pod("g-1", "new", rank="1")]
    metrics = {"g-0": scrape(10, 20), "g-1": scrape(0, 0, failed=5)}
    judged = verdicts(VerificationSpec(), [state("new", 1)], pods, metrics)
    assert judged["new"].outcome == Outcome.VERIFIED


def verdict(outcome: Outcome, finding: Finding = Finding.VERIFIED) -> Verdict:
    return Verdict(outcome, finding, "why", Handoff())


@pytest.mark.parametrize(
    ("mode", "outcome", "fails", "awaits", "verified"),
    [
        ("Gate", Outcome.FAILED, True, False, False),
        ("Gate", Outcome.PENDING, False, True, False),
        ("Gate", Outcome.VERIFIED, False, False, True),
        ("Rollback", Outcome.FAILED, True, False, False),
        ("Rollback", Outcome.PENDING, False, True, False),
        ("Rollback", Outcome.VERIFIED, False, False, True),
        ("Report", Outcome.FAILED, False, False, False),
        ("Report", Outcome.VERIFIED, False, False, True),
        ("Off", Outcome.FAILED, False, False, False),
    ],
)
def test_what_each_mode_makes_of_a_verdict(
    mode: Any, outcome: Outcome, fails: bool, awaits: bool, verified: bool
) -> None:
    g = rollout_gate(VerificationSpec(mode=mode), verdict(outcome, Finding.PULL_FAILED))
    assert (g.failure is not None, g.awaiting is not None, g.verified) == (fails, awaits, verified)
    # Only the default mode lets a rollout go on when no verdict comes by the deadline.
    assert g.release_at_deadline == (awaits and mode == "Rollback")
    assert rollout_gate(VerificationSpec(mode=mode), None).failure is None


def _steer(
    b: PDDBuilder, states: list[RevisionState], judged: Outcome | None, promoted: str | None = None
) -> Any:
    built = b.build()
    spec = built.spec
    agreement = check(spec)
    target, policy = target_and_policy(agreement)
    health = PodHealth(
        verification=rollout_gate(
            spec.effective_verification, None if judged is None else verdict(judged)
        )
    )
    ctx = Context(
        pdd=built,
        agreement=agreement,
        generation=1,
        old=PDDeploymentStatus(),
        now=NOW,
        stamp=format_time(NOW),
        promoted=promoted,
    )
    return steer(ctx, target, policy, states, health)


def _new(b: PDDBuilder) -> RevisionState:
    rev = target_and_policy(check(b.build().spec))[0].revision
    assert rev is not None
    return RevisionState(rev, RoleState(1, 1, 1), RoleState(1, 1, 1), RoleState(1, 1, 1), created=5)


def test_a_failed_verdict_rolls_back_while_an_older_revision_serves() -> None:
    b = pdd("x").mtp(2, modules=3)
    new = _new(b)
    s = _steer(b, [OLD, new], Outcome.FAILED)
    assert s.rolling_back and s.target.revision == "old"
    assert s.failure is not None and s.failure.startswith("verification failed")
    # Nothing older serves: the verdict is reported (Verified False), the rollout is no failure.
    alone = _steer(b, [new], Outcome.FAILED)
    assert not alone.rolling_back and alone.failure is None
    # Hold keeps the rollout where it is.
    held = _steer(pdd("x").mtp(2, modules=3).rollout(onFailure="Hold"), [OLD, new], Outcome.FAILED)
    assert not held.rolling_back and held.failure is not None


def test_gate_holds_the_old_revision_until_verified_and_a_promotion_overrides() -> None:
    b = pdd("x").mtp(2, modules=3).set(verification={"mode": "Gate"})
    new = _new(b)
    waiting = _steer(b, [OLD, new], Outcome.PENDING)
    assert waiting.policy.verifying and waiting.awaiting_verdict is not None
    assert not _steer(b, [OLD, new], Outcome.VERIFIED).policy.verifying
    assert not _steer(b, [OLD, new], Outcome.PENDING, promoted=new.revision).policy.verifying
    assert not _steer(b, [new], Outcome.PENDING).policy.verifying  # nothing old to keep


def test_a_canary_with_auto_promote_goes_on_once_verified() -> None:
    b = pdd("x").mtp(2, modules=3).rollout(canary={"percent": 25, "autoPromote": True})
    new = _new(b)
    assert _steer(b, [OLD, new], Outcome.PENDING).policy.canary_percent == 25
    assert _steer(b, [OLD, new], Outcome.VERIFIED).policy.canary_percent is None
    manual = pdd("x").mtp(2, modules=3).rollout(canary={"percent": 25})
    assert _steer(manual, [OLD, _new(manual)], Outcome.VERIFIED).policy.canary_percent == 25


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    a=targets("aaaa"),
    b=targets("bbbb"),
    policy=policies,
    seed=st.integers(0, 2**32),
    verified_at=st.integers(0, 60),
    lag=st.booleans(),
)
def test_awaiting_a_verdict_keeps_the_old_revision_routed_then_completes(
    a: Target, b: Target, policy: Policy, seed: int, verified_at: int, lag: bool
) -> None:
    """Simulated whole rollouts under Gate: while the new revision is not Verified, no step
    un-routes or retires the old one (a rollback must find it serving), every invariant holds,
    and once Verified the rollout completes."""
    rng = random.Random(seed)
    sim = SimCluster.serving("aaaa", a, controller_lag=lag)
    monitor = InvariantMonitor(policy)
    verifying = replace(policy, verifying=True)
    trace = simulate_rollout(sim, monitor, b, rng, policy=verifying, max_ticks=verified_at)
    assert not trace.complete
    for _, _, step in trace.steps:
        old = next(p for p in step.revisions if p.revision == "aaaa")
        assert old.router > 0 and not old.delete and old.drain_until is None, step
    assert any(s.revision == "aaaa" and s.serving for s in sim.observe()) or verified_at < 3
    assert simulate_rollout(sim, monitor, b, rng, max_ticks=3000).complete
    assert {s.revision for s in sim.observe()} == {"bbbb"}


def test_a_settled_roll_awaiting_its_verdict_says_so() -> None:
    sim = SimCluster.serving("aaaa", Target("aaaa", 2, 2, 1))
    rng = random.Random(1)
    monitor = InvariantMonitor(Policy(1, 0, 0))
    trace = simulate_rollout(
        sim,
        monitor,
        Target("bbbb", 2, 2, 1),
        rng,
        policy=Policy(1, 0, 0, verifying=True),
        max_ticks=200,
        ready_chance=1.0,
    )
    last = trace.steps[-1][2]
    assert last.blocked and "Verified" in last.reason


# ---- through the reconcile ----------------------------------------------------------------------


def cluster_of(b: PDDBuilder) -> FakeCluster:
    obj = b.dict()
    obj["metadata"].update(namespace="ns", uid="u-1", generation=1)
    return FakeCluster(obj)


def rounds(cluster: FakeCluster, start: float, count: int) -> list[Decision]:
    out = []
    for i in range(count):
        out.append(cluster.reconcile(start + i))
        cluster.run_pods()
    return out


def decodes(cluster: FakeCluster, revision: str) -> list[str]:
    return [
        n
        for n, p in cluster.pods.items()
        if p["metadata"]["labels"].get(v.LABEL_ROLE) == "decode"
        and p["metadata"]["labels"].get(v.LABEL_REVISION) == revision
    ]


def report(cluster: FakeCluster, revision: str, metrics: PodMetrics) -> None:
    for name in decodes(cluster, revision):
        cluster.metrics[name] = metrics


def condition(cluster: FakeCluster, kind: str) -> dict[str, Any]:
    return next(c for c in cluster.body["status"]["conditions"] if c["type"] == kind)


def revisions(cluster: FakeCluster) -> set[str]:
    return {p["metadata"]["labels"][v.LABEL_REVISION] for p in cluster.pods.values()}


def start(b: PDDBuilder) -> tuple[FakeCluster, str]:
    cluster = cluster_of(b)
    rounds(cluster, NOW, 6)
    (old,) = revisions(cluster)
    report(cluster, old, scrape(20, 20, drafts=100, accepted=150))  # lookahead 2: backoff 1
    rounds(cluster, NOW + 6, 2)
    assert condition(cluster, "Verified")["status"] == "True"
    return cluster, old


def new_revision(cluster: FakeCluster) -> str:
    cluster.body["spec"]["speculative"]["numSpeculativeTokens"] = 3
    cluster.body["metadata"]["generation"] += 1
    return compat_revision(PDDeployment.model_validate(cluster.body).spec)


def test_a_new_revision_whose_pulls_fail_is_rolled_back_with_the_reason() -> None:
    cluster, old = start(pdd("x").mtp(2, modules=3))
    new = new_revision(cluster)
    rounds(cluster, NOW + 10, 2)
    report(cluster, new, scrape(5, 10, failed=3))
    decisions = rounds(cluster, NOW + 12, 12)
    status = cluster.body["status"]
    assert status["rollout"]["phase"] == "RolledBack", status["rollout"]
    assert status["rollout"]["failure"].startswith("verification failed (KVLoadFailed)")
    assert revisions(cluster) == {old}
    verified = condition(cluster, "Verified")
    degraded = condition(cluster, "Degraded")
    assert (verified["status"], verified["reason"]) == ("False", reasons.KV_LOAD_FAILED)
    assert degraded["reason"] == reasons.ROLLED_BACK and "KVLoadFailed" in degraded["message"]
    said = [e.reason for d in decisions for e in d.events]
    assert reasons.ROLLBACK_STARTED in said and reasons.KV_LOAD_FAILED in said


def test_rollback_mode_keeps_the_old_pods_for_a_verdict_until_the_deadline_then_goes_on() -> None:
    """The default mode, with the rollout's default counts (1 prefill, 1 decode): the old
    revision serves until the new one has a verdict; none by the deadline, the rollout goes on
    unverified, says so once, and does not hold again for this spec (issue 50)."""
    cluster, old = start(pdd("x").mtp(2, modules=3).rollout(progressDeadlineSeconds=30))
    new = new_revision(cluster)
    rounds(cluster, NOW + 10, 16)
    assert revisions(cluster) == {old, new}
    assert condition(cluster, "Progressing")["reason"] == reasons.AWAITING_VERDICT
    assert condition(cluster, "Verified")["reason"] == reasons.NO_METRICS
    said = []
    for i in range(12):
        said += [e.reason for e in cluster.reconcile(NOW + 50 + 10 * i).events]
        cluster.run_pods()
    rounds(cluster, NOW + 200, 30)
    assert revisions(cluster) == {new}
    assert said.count(reasons.VERDICT_WAIVED) == 1, said
    waived = cluster.body["status"]["rollout"]["verdictWaived"]
    assert waived.startswith("no verdict within 30s"), waived
    assert condition(cluster, "Progressing")["reason"] == reasons.ROLLOUT_COMPLETE


def test_rollback_mode_rolls_back_a_failing_revision_however_small() -> None:
    """1 prefill, 1 decode, the default mode: the new decodes' pulls fail before the old
    revision is gone, since it waits for the verdict (issue 50: it used to be retired first)."""
    cluster, old = start(pdd("x").mtp(2, modules=3))
    new = new_revision(cluster)
    rounds(cluster, NOW + 10, 16)
    assert revisions(cluster) == {old, new}
    report(cluster, new, scrape(0, 0, failed=5))
    rounds(cluster, NOW + 26, 30)
    assert revisions(cluster) == {old}
    assert cluster.body["status"]["rollout"]["phase"] == "RolledBack"


def test_gate_keeps_the_old_revision_serving_until_the_new_one_is_verified() -> None:
    cluster, old = start(pdd("x").mtp(2, modules=3).set(verification={"mode": "Gate"}))
    new = new_revision(cluster)
    rounds(cluster, NOW + 10, 16)
    assert revisions(cluster) == {old, new}
    progressing = condition(cluster, "Progressing")
    assert progressing["reason"] == reasons.AWAITING_VERDICT, progressing
    report(cluster, new, scrape(4, 8))  # too few requests yet (lookahead 3: backoff 2)
    rounds(cluster, NOW + 26, 4)
    assert revisions(cluster) == {old, new}
    assert condition(cluster, "Verified")["reason"] == reasons.AWAITING_REQUESTS
    report(cluster, new, scrape(12, 24, drafts=100, accepted=150))
    rounds(cluster, NOW + 30, 90)
    assert revisions(cluster) == {new}
    assert condition(cluster, "Progressing")["reason"] == reasons.ROLLOUT_COMPLETE
    table = {r["revision"]: r["verification"] for r in cluster.body["status"]["revisions"]}
    assert table[new]["verdict"] == "Verified" and table[new]["requests"] == 12
    assert table[new]["recomputedTokens"] == 24 and table[new]["expectedBackoff"] == 2


def test_gate_fails_a_rollout_whose_verdict_does_not_come_by_the_deadline() -> None:
    b = pdd("x").mtp(2, modules=3).set(verification={"mode": "Gate"})
    cluster, old = start(b.rollout(progressDeadlineSeconds=30))
    new_revision(cluster)
    rounds(cluster, NOW + 10, 12)
    for i in range(8):
        cluster.reconcile(NOW + 40 + 10 * i)
        cluster.run_pods()
    status = cluster.body["status"]
    assert status["rollout"]["failure"].startswith("not Verified within 30s"), status["rollout"]
    assert revisions(cluster) == {old}


def test_a_verdict_whose_evidence_moves_is_news_only_when_its_finding_changes() -> None:
    """Verified's message carries the evidence, which moves at every scrape: a Failed verdict
    re-judged as it stays Failed is one event, not one a scrape (the demo showed seven in 12 s);
    another finding is news. Other warning conditions keep their rule: a new message is news."""

    def verified(reason: str, message: str, type_: str = reasons.VERIFIED) -> Condition:
        return Condition(
            type=type_, status="False", reason=reason, message=message,
            last_transition_time="2026-12-07T00:00:00Z",
        )  # fmt: skip

    regressed = reasons.ACCEPTANCE_REGRESSED
    was = [verified(regressed, "0.716 accepted token(s) per draft against 1.409")]
    assert condition_events([], was, [verified(regressed, "0.723 against 1.409")]) == []
    (news,) = condition_events([], was, [verified(reasons.KV_LOAD_FAILED, "3 of 4 failed")])
    assert news.reason == reasons.KV_LOAD_FAILED
    refused = sorted(reasons.WARNING_REASONS)[0]
    one, two = (verified(refused, m, type_=reasons.AVAILABLE) for m in ("one", "two"))
    assert len(condition_events([], [one], [two])) == 1

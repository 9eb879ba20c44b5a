"""A role-local change judged as a new revision is (issue 50, item 3): through the reconcile on
the fake cluster, whose Deployments roll as the controller does and honour a held roll's
minReadySeconds (its new pods never count as available)."""

from __future__ import annotations

from typing import Any

import pytest
from builders import PDDBuilder, pdd
from pdmtp.api import reasons
from pdmtp.api import vocabulary as v
from pdmtp.core.promtext import Scrape
from pdmtp.core.reconcile import Decision
from pdmtp.core.render.children import HOLD_SECONDS
from pdmtp.core.windows import PodMetrics

from tests.support.fake_cluster import FakeCluster

NOW = 1_800_000_000.0


def scrape(requests: float, backoff: float, *, counted: bool = True) -> PodMetrics:
    """A decode's first scrape; `counted` False: an engine without the fixed connector, which
    exports no hand-off counts."""
    return PodMetrics().scraped(
        Scrape(
            NOW,
            kv_pulled_requests=requests if counted else None,
            kv_pulled_tokens=requests * 100 if counted else None,
            kv_backoff_tokens=backoff if counted else None,
            kv_decode_only_requests=0 if counted else None,
            failed_recvs=0,
            drafts=100,
            accepted_tokens=150,
        )
    )


GOOD = scrape(20, 20)  # lookahead 2: backoff 1


def steady(end: float, count: int = 8, accepted: float = 75) -> PodMetrics:
    """A decode scraped every 15 s, `count` times up to `end`: each window 10 pulls (backoff 1
    each), 50 drafts and about `accepted` accepted tokens (5 % either way)."""
    held = PodMetrics()
    for n in range(1, count + 1):
        held = held.scraped(
            Scrape(end - 15 * (count - n), kv_pulled_requests=10 * n, kv_pulled_tokens=1000 * n,
                   kv_backoff_tokens=10 * n, kv_decode_only_requests=0, failed_recvs=0,
                   drafts=50 * n, accepted_tokens=accepted * n + (0.05 * accepted if n % 2 else 0))
        )  # fmt: skip
    return held


def rounds(cluster: FakeCluster, start: float, count: int) -> list[Decision]:
    out = []
    for i in range(count):
        out.append(cluster.reconcile(start + i))
        cluster.run_pods()
    return out


def role_pods(cluster: FakeCluster, role: str) -> dict[str, str]:
    """The role's live pods and their role hash."""
    return {
        n: p["metadata"]["annotations"][v.ANNOTATION_ROLE_HASH]
        for n, p in cluster.pods.items()
        if p["metadata"]["labels"].get(v.LABEL_ROLE) == role and not cluster.terminating(n)
    }


def report(cluster: FakeCluster, pods: Any, metrics: PodMetrics) -> None:
    for name in pods:
        cluster.metrics[name] = metrics


def condition(cluster: FakeCluster, kind: str) -> dict[str, Any]:
    return next(c for c in cluster.body["status"]["conditions"] if c["type"] == kind)


def deployment(cluster: FakeCluster, role: str) -> dict[str, Any]:
    return next(
        d
        for d in cluster.objects.values()
        if d.get("kind") == "Deployment" and d["metadata"]["labels"][v.LABEL_ROLE] == role
    )


def rolls(cluster: FakeCluster) -> list[dict[str, Any]]:
    return list(cluster.body["status"].get("templateRolls") or [])


def start(b: PDDBuilder) -> FakeCluster:
    obj = b.dict()
    obj["metadata"].update(namespace="ns", uid="u-1", generation=1)
    cluster = FakeCluster(obj, unique_names=True)
    rounds(cluster, NOW, 6)
    report(cluster, role_pods(cluster, "decode"), GOOD)
    rounds(cluster, NOW + 6, 2)
    assert condition(cluster, "Verified")["status"] == "True"
    return cluster


def change(cluster: FakeCluster, role: str, value: str) -> None:
    """A role-local change: an env var of one role."""
    cluster.body["spec"].setdefault(role, {})["env"] = [{"name": "SOME_KNOB", "value": value}]
    cluster.body["metadata"]["generation"] += 1


def events(decisions: list[Decision]) -> list[str]:
    return [e.reason for d in decisions for e in d.events]


def test_a_decode_change_is_held_at_its_first_new_pod_and_goes_on_once_verified() -> None:
    cluster = start(pdd("x").mtp(2, modules=3).decode(replicas=2))
    before = role_pods(cluster, "decode")
    change(cluster, "decode", "1")
    said = events(rounds(cluster, NOW + 10, 12))
    now = role_pods(cluster, "decode")
    new = [n for n in now if n not in before]
    assert len(new) == 1 and set(before) <= set(now), now  # one new pod, every old one serving
    assert deployment(cluster, "decode")["spec"]["minReadySeconds"] == HOLD_SECONDS
    (roll,) = rolls(cluster)
    assert (roll["role"], roll["phase"]) == ("decode", "Judging"), roll
    assert roll["verifiedTemplate"] == next(iter(before.values()))
    assert condition(cluster, "Progressing")["reason"] == reasons.AWAITING_VERDICT
    assert condition(cluster, "Verified")["status"] == "Unknown"
    assert said.count(reasons.TEMPLATE_HELD) == 1, said
    # Both templates draft alike over the same span: the new one is Verified.
    report(cluster, now, steady(NOW + 30))
    said = events(rounds(cluster, NOW + 30, 12))
    assert set(role_pods(cluster, "decode").values()) == {now[new[0]]}  # all on the new template
    assert said.count(reasons.TEMPLATE_VERIFIED) == 1, said
    assert not deployment(cluster, "decode")["spec"].get("minReadySeconds")
    assert rolls(cluster) == []  # done: nothing left to say
    assert condition(cluster, "Progressing")["reason"] == reasons.ROLLOUT_COMPLETE


def test_a_decode_template_without_the_fixed_connector_goes_back_and_stays_back() -> None:
    cluster = start(pdd("x").mtp(2, modules=3).set(verification={"mode": "Gate"}))
    before = role_pods(cluster, "decode")
    change(cluster, "decode", "drops-the-connector")
    rounds(cluster, NOW + 10, 8)
    new = [n for n in role_pods(cluster, "decode") if n not in before]
    assert len(new) == 1
    report(cluster, new, scrape(20, 0, counted=False))
    # The verdict's round: the failed pod leaves routing while its template is still held (the
    # controller would delete it faster than a router rolls); the role goes back after that.
    said = events([cluster.reconcile(NOW + 20)])
    (pod,) = new
    assert v.ANNOTATION_LEAVING in cluster.pods[pod]["metadata"]["annotations"]
    held = deployment(cluster, "decode")["spec"]
    assert held["minReadySeconds"] == HOLD_SECONDS
    assert held["template"]["metadata"]["annotations"][v.ANNOTATION_ROLE_HASH] != next(
        iter(before.values())
    )
    router = deployment(cluster, "router")["spec"]["template"]
    assert cluster.pods[pod]["status"]["podIP"] not in str(router)
    cluster.run_pods()
    said += events(rounds(cluster, NOW + 21, 40))
    assert role_pods(cluster, "decode") == before  # the same pods, never replaced
    (roll,) = rolls(cluster)
    assert roll["phase"] == "Failed" and roll["reason"] == reasons.HANDOFF_NOT_REPORTED, roll
    verified = condition(cluster, "Verified")
    assert (verified["status"], verified["reason"]) == ("False", reasons.HANDOFF_NOT_REPORTED)
    assert condition(cluster, "Progressing")["reason"] == reasons.ROLLOUT_ABORTED
    assert said.count(reasons.TEMPLATE_ROLLED_BACK) == 1, said
    template = deployment(cluster, "decode")["spec"]["template"]["metadata"]["annotations"]
    assert template[v.ANNOTATION_ROLE_HASH] == roll["verifiedTemplate"]
    # The next change of the role's settings rolls again, judged afresh.
    change(cluster, "decode", "fixed")
    rounds(cluster, NOW + 70, 8)
    (again,) = rolls(cluster)
    assert again["phase"] == "Judging" and again["verifiedTemplate"] == roll["verifiedTemplate"]


@pytest.mark.parametrize(("mode", "phase"), [("Rollback", "Waived"), ("Gate", "Failed")])
def test_no_verdict_by_the_deadline(mode: str, phase: str) -> None:
    b = pdd("x").mtp(2, modules=3).set(verification={"mode": mode})
    cluster = start(b.rollout(progressDeadlineSeconds=30))
    before = role_pods(cluster, "decode")
    change(cluster, "decode", "1")
    rounds(cluster, NOW + 10, 10)
    said = []
    for i in range(6):
        said += [e.reason for e in cluster.reconcile(NOW + 40 + 10 * i).events]
        cluster.run_pods()
    rounds(cluster, NOW + 100, 10)
    after = role_pods(cluster, "decode")
    if phase == "Waived":
        assert set(after).isdisjoint(before) and said.count(reasons.VERDICT_WAIVED) == 1, said
        assert rolls(cluster) == []
    else:
        assert after == before and said.count(reasons.TEMPLATE_ROLLED_BACK) == 1, said
        assert "progressDeadlineSeconds" in rolls(cluster)[0]["message"]


def test_a_prefill_change_is_judged_through_the_decodes_it_serves() -> None:
    cluster = start(pdd("x").mtp(2, modules=3))
    before = role_pods(cluster, "prefill")
    change(cluster, "prefill", "1")
    rounds(cluster, NOW + 10, 8)
    assert set(before) < set(role_pods(cluster, "prefill"))  # held: the old one stays
    (roll,) = rolls(cluster)
    assert (roll["role"], roll["phase"]) == ("prefill", "Judging"), roll
    # The decodes' windows after the new prefill became Ready: most pulls fail.
    decodes = role_pods(cluster, "decode")
    for name in decodes:
        cluster.metrics[name] = cluster.metrics[name].scraped(
            Scrape(NOW + 40, kv_pulled_requests=40, kv_pulled_tokens=4000, kv_backoff_tokens=40,
                   kv_decode_only_requests=0, failed_recvs=15, drafts=200, accepted_tokens=300)
        )  # fmt: skip
    rounds(cluster, NOW + 41, 20)
    assert role_pods(cluster, "prefill") == before
    assert rolls(cluster)[0]["phase"] == "Failed"


def test_report_mode_rolls_a_role_local_change_unheld() -> None:
    cluster = start(pdd("x").mtp(2, modules=3).set(verification={"mode": "Report"}))
    before = role_pods(cluster, "decode")
    change(cluster, "decode", "1")
    rounds(cluster, NOW + 10, 8)
    assert set(role_pods(cluster, "decode")).isdisjoint(before)
    assert "templateRolls" not in cluster.body["status"]
    assert not deployment(cluster, "decode")["spec"].get("minReadySeconds")


def test_a_new_pod_that_never_comes_up_is_not_waived_and_a_pause_says_paused() -> None:
    """Mode Rollback: a template whose first pod never becomes Ready has no verdict to waive at
    the deadline, so the old pods keep serving (its failure is Degraded's and waitingFor's); a
    paused rollout says Paused, as it did before role-local rolls were judged."""
    cluster = start(pdd("x").mtp(2, modules=3).rollout(progressDeadlineSeconds=30))
    before = role_pods(cluster, "decode")
    change(cluster, "decode", "1")
    said = []
    for i in range(10):
        said += [e.reason for e in cluster.reconcile(NOW + 10 + 10 * i).events]
        cluster.run_pods(ready=False)
    assert set(before) < set(role_pods(cluster, "decode")), role_pods(cluster, "decode")
    assert rolls(cluster)[0]["phase"] == "Judging" and reasons.VERDICT_WAIVED not in said, said
    cluster.body["spec"]["rollout"]["paused"] = True
    cluster.body["metadata"]["generation"] += 1
    rounds(cluster, NOW + 120, 2)
    assert condition(cluster, "Progressing")["reason"] == reasons.PAUSED


def test_a_new_template_whose_pulls_fail_is_judged_whole_not_replaced_pod_by_pod() -> None:
    """A wrong RDMA device in a role-local change: the new decode's pulls fail. Its template
    fails its verdict and the role goes back; the pod is not marked for replacement first (a
    replacement would carry the same template)."""
    cluster = start(pdd("x").mtp(2, modules=3).decode(replicas=2))
    before = role_pods(cluster, "decode")
    change(cluster, "decode", "wrong-device")
    rounds(cluster, NOW + 10, 8)
    (new,) = [n for n in role_pods(cluster, "decode") if n not in before]
    failing = cluster.metrics.get(new, PodMetrics())
    for n, at in enumerate((NOW + 20, NOW + 35), start=1):
        failing = failing.scraped(
            Scrape(at, kv_pulled_requests=10 * n, kv_pulled_tokens=1000 * n,
                   kv_backoff_tokens=10 * n, kv_decode_only_requests=0, failed_recvs=8 * n,
                   drafts=50 * n, accepted_tokens=75 * n)
        )  # fmt: skip
    cluster.metrics[new] = failing
    marked = []
    for i in range(20):
        cluster.reconcile(NOW + 36 + i)
        marked += [
            n for n, p in cluster.pods.items()
            if v.ANNOTATION_REPLACE in (p["metadata"].get("annotations") or {})
        ]  # fmt: skip
        cluster.run_pods()
    assert marked == [], marked
    assert role_pods(cluster, "decode") == before
    assert rolls(cluster)[0]["reason"] == reasons.KV_LOAD_FAILED, rolls(cluster)

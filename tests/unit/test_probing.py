"""The operator's own requests for a revision's verdict (`core.verification.probing`,
`pdmtp.probe`): only revisions that wait for requests or drafts, only through their own Ready
router, only while every role of theirs serves, at the spec's rate, and never dialled by the test
target."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from builders import pdd
from pdmtp.api import reasons
from pdmtp.api import vocabulary as v
from pdmtp.api.v1alpha1 import VerificationSpec
from pdmtp.cache import ChildStore, Table
from pdmtp.core.verification.probing import MAX_TOKENS, PROMPT, awaiting, due
from pdmtp.probe import DirectoryTarget, HttpTarget, Prober, target_from

NOW = 1000.0


def pod(name: str, revision: str, role: str, ready: bool = True, ip: str | None = "") -> Any:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "labels": {v.LABEL_NAME: "x", v.LABEL_REVISION: revision, v.LABEL_ROLE: role},
        },
        "status": {
            "phase": "Running",
            "podIP": f"192.0.2.{len(name)}" if ip == "" else ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def revision(name: str, reason: str | None, verdict: str = "Pending") -> dict[str, Any]:
    entry: dict[str, Any] = {"revision": name}
    if reason is not None:
        entry["verification"] = {"verdict": verdict, "reason": reason}
    return entry


def pods_of(rev: str) -> list[Any]:
    return [pod(f"{rev}-{role}", rev, role) for role in v.ROLES]


STATUS = {
    "revisions": [
        revision("new", reasons.AWAITING_REQUESTS),
        revision("drafting", reasons.AWAITING_DRAFTS),
        revision("old", reasons.HANDOFF_VERIFIED, "Verified"),
        revision("broken", reasons.KV_PULL_FAILED, "Failed"),
        revision("unscraped", reasons.NO_METRICS),
        revision("off", None),
    ]
}


def test_only_revisions_that_more_requests_would_decide_are_probed() -> None:
    assert awaiting(STATUS) == ["new", "drafting"]
    pods = [p for r in ("new", "drafting", "old", "broken", "unscraped") for p in pods_of(r)]
    probes = due(VerificationSpec(), "m", STATUS, pods, {}, NOW)
    assert [(p.revision, p.router) for p in probes] == [
        ("new", "new-router"),
        ("drafting", "drafting-router"),
    ]
    ip = pods_of("new")[2]["status"]["podIP"]
    assert probes[0].url == f"http://{ip}:{v.ROUTER_HTTP_PORT}/v1/completions"
    assert probes[0].body == {"model": "m", "prompt": PROMPT, "max_tokens": MAX_TOKENS}


def test_the_current_revision_is_probed_beside_a_revision_compared_with_it() -> None:
    """Its acceptance is the reference: the probes' prompt must weigh on both sides alike."""
    status = {**STATUS, "currentRevision": "old"}
    pods = [p for r in ("new", "drafting", "old") for p in pods_of(r)]
    probes = due(VerificationSpec(), "m", status, pods, {}, NOW)
    assert [p.revision for p in probes] == ["new", "drafting", "old"]
    alone = {"currentRevision": "new", "revisions": [revision("new", reasons.AWAITING_DRAFTS)]}
    assert [p.revision for p in due(VerificationSpec(), "m", alone, pods, {}, NOW)] == ["new"]
    settled = {"currentRevision": "old", "revisions": [revision("old", reasons.HANDOFF_VERIFIED)]}
    assert due(VerificationSpec(), "m", settled, pods, {}, NOW) == []


def test_a_role_local_roll_held_for_requests_is_probed_through_its_revision() -> None:
    """Its router lists the new template's pods beside the old ones: probes reach both."""
    rolls = [
        {"revision": "old", "phase": phase, "reason": reason}
        for phase, reason in [("Judging", reasons.AWAITING_DRAFTS), ("Failed", reasons.NO_METRICS)]
    ]
    status = {"currentRevision": "old", "revisions": [revision("old", reasons.HANDOFF_VERIFIED)]}
    assert awaiting({**status, "templateRolls": rolls}) == ["old"]
    assert awaiting({**status, "templateRolls": rolls[1:]}) == []
    probes = due(
        VerificationSpec(), "m", {**status, "templateRolls": rolls}, pods_of("old"), {}, NOW
    )
    assert [p.revision for p in probes] == ["old"]


@pytest.mark.parametrize("role", v.ROLES)
def test_a_revision_with_a_role_not_ready_gets_no_probe(role: str) -> None:
    pods = [pod(f"new-{r}", "new", r, ready=r != role) for r in v.ROLES]
    assert due(VerificationSpec(), "m", STATUS, pods, {}, NOW)[:1] == []
    leaving = pods_of("new")
    for p in leaving:
        if p["metadata"]["labels"][v.LABEL_ROLE] == role:
            p["metadata"]["annotations"] = {v.ANNOTATION_LEAVING: "t"}
            p["metadata"]["deletionTimestamp"] = "t" if role == "router" else None
    assert due(VerificationSpec(), "m", STATUS, leaving, {}, NOW)[:1] == []


def test_a_router_without_an_address_is_not_dialled_and_ipv6_is_bracketed() -> None:
    pods = [*pods_of("new")[:2], pod("new-router", "new", "router", ip=None)]
    assert due(VerificationSpec(), "m", STATUS, pods, {}, NOW)[:1] == []
    pods[2] = pod("new-router", "new", "router", ip="fd00::7")
    (probe, *_) = due(VerificationSpec(), "m", STATUS, pods, {}, NOW)
    assert probe.url == f"http://[fd00::7]:{v.ROUTER_HTTP_PORT}/v1/completions"


@pytest.mark.parametrize(("rate", "gap"), [(12, 5.0), (1, 60.0), (600, 0.1)])
def test_the_rate_bounds_each_revision(rate: int, gap: float) -> None:
    spec = VerificationSpec(probeRequestsPerMinute=rate)
    status = {"revisions": [revision("new", reasons.AWAITING_REQUESTS)]}
    assert due(spec, "m", status, pods_of("new"), {"new": NOW - gap * 0.99}, NOW) == []
    assert len(due(spec, "m", status, pods_of("new"), {"new": NOW - gap}, NOW)) == 1


@pytest.mark.parametrize(
    "spec", [{"mode": "Off"}, {"probeRequestsPerMinute": 0}], ids=["off", "opted-out"]
)
def test_probes_can_be_turned_off(spec: dict[str, Any]) -> None:
    rules = VerificationSpec.model_validate(spec)
    assert due(rules, "m", STATUS, pods_of("new"), {}, NOW) == []


def test_a_test_target_records_and_never_dials(tmp_path: Path) -> None:
    (probe,) = due(VerificationSpec(), "m", STATUS, pods_of("new"), {}, NOW)
    target = target_from(f"dir:{tmp_path}")
    assert isinstance(target, DirectoryTarget)
    assert target.send("ns", "x", probe) == "recorded"
    assert target.send("ns", "x", probe) == "recorded"
    lines = [json.loads(x) for x in (tmp_path / "ns" / "x.probes").read_text().splitlines()]
    assert [(x["revision"], x["router"], x["url"]) for x in lines] == [
        ("new", "new-router", probe.url)
    ] * 2
    assert isinstance(target_from(None), HttpTarget) and isinstance(target_from("http"), HttpTarget)
    with pytest.raises(ValueError, match="--probe-target"):
        target_from("tcp:1")


def test_the_prober_sends_one_at_a_time_per_revision(tmp_path: Path) -> None:
    body = pdd("x").dict()
    body["metadata"].update(namespace="ns", uid="u")
    body["status"] = {"revisions": [revision("new", reasons.AWAITING_REQUESTS)]}
    pdds = Table()
    pdds.put("PDDeployment", body)
    store = ChildStore()
    for p in pods_of("new"):
        store.put("Pod", p)
    prober = Prober(DirectoryTarget(tmp_path), pdds, store)
    (probe,) = prober.due_now(("ns", "x"), NOW)
    prober.in_flight[("ns", "x")] = {"new"}
    assert prober.due_now(("ns", "x"), NOW + 60) == [], "one in flight: none more"
    prober.in_flight.clear()

    async def a_few_ticks() -> None:
        task = asyncio.create_task(prober.run())
        await asyncio.sleep(2.5)
        task.cancel()

    asyncio.run(a_few_ticks())
    sent = (tmp_path / "ns" / "x.probes").read_text().splitlines()
    assert len(sent) == 1, "12 a minute: one in 2.5 s"
    assert json.loads(sent[0])["url"] == probe.url

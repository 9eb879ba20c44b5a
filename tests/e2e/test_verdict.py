"""The verdict moving rollouts on a real kind cluster (issue 41), with emulated engines that
misbehave the ways a real pair does, under a bounded in-cluster request loop, judged by the
operator in the cluster from the engines' own metrics (it scrapes each decode's metrics port).

The traffic is mixed (issue 50): the load client sends code and chat requests in equal shares,
which the emulated decodes accept at different rates (`HEALTHY`: code 0.85, chat 0.55), so the
windows the verdict judges vary with the mix, as real traffic's do.

1. a healthy revision serves and is Verified; `pdmtp verify` exits 0;
2. (a) a canary (autoPromote) whose new revision accepts 15 % fewer drafts in each class
   (`WORSE`) is rolled back by itself: no request fails or crosses revisions, the reason is in
   status and `pdmtp verify` exits 1; the seconds to the rollback and the share of the answers
   the bad revision gave are printed;
3. (b) under mode Gate, a paired roll whose pulls fail never retires the old revision's pods and
   rolls back, no request failing (a failed pull is recomputed by the decode);
4. (c) a healthy canary promotes itself on its verdict and completes, and `pdmtp verify` says so;
5. (d) with two decodes, a role-local change (loadFailurePolicy recompute -> fail, vLLM's
   default) is held at its first new decode, Verified under load and rolled through, no request
   failing; then a serving decode whose pulls start failing (its emulator's knob changed while
   it serves) leaves routing at once, the other carrying the requests, and is replaced after: no
   request crossing revisions, the requests it failed counted (issue 50's figure to beat: 770 of
   5,697 over 98 s), and the revision is Verified again; the role goes back to one decode;
6. a canary with no traffic at all is judged on the operator's own probe requests and promotes
   itself;
7. under mode Gate, a decode env change (role-local, no new revision) whose engine lacks the
   fixed connector is held at its first new decode and goes back to the Verified template, the
   old decode untouched, no request failing.

Steps 2 to 4 and 6 change model.revision (a new revision the emulator does not care about) and
the decode's emulator knobs (`PDMTP_EMULATOR_*`) in one patch, which replaces the decode's whole
env: each carries the classes' rates, `HEALTHY` but in step 2. Until step 5 the decodes recompute
a prompt whose KV pull failed (`kvTransfer.loadFailurePolicy: recompute`), so every request is
answered and the load client counts the ones without the prefill's KV; from step 5 on, vLLM's
default, fail, fails such a request. The operator probes a revision (or a held role-local roll)
that waits for requests at 60 a minute, so that step 6's canary with no traffic is judged soon.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from builders import pdd
from e2e.kindkit import Kind, LoadRun, wait_for
from e2e.kindkit import serving as serves
from pdmtp.api import reasons
from pdmtp.api.vocabulary import ANNOTATION_ROLE_HASH, LABEL_NAME, LABEL_REVISION, LABEL_ROLE
from pdmtp.verifyctl import EXIT_FAILED, EXIT_VERIFIED

NAME = "judged"
MIXED = "code=1,chat=1"
"""The load client's request classes: code and chat, in equal shares."""
HEALTHY = "code=0.85,chat=0.55"
"""Each class's share of draft tokens accepted (PDMTP_EMULATOR_CLASS_ACCEPTANCE)."""
WORSE = "code=0.72,chat=0.47"
"""HEALTHY's rates 15 % lower (0.85 * 0.85, 0.55 * 0.85)."""
PDMTP = Path(sys.executable).parent / "pdmtp"
state: dict[str, Any] = {}


def spec_for(kind: Kind) -> dict[str, Any]:
    return (
        pdd(NAME)
        .set(image=kind.images.emulator, model={"name": kind.images.engine_model})
        .mtp(3, modules=3, method="deepseek_mtp")
        .set(kvTransfer={"loadFailurePolicy": "recompute"})
        .prefill(env=knobs(class_acceptance=HEALTHY))
        .decode(env=knobs(class_acceptance=HEALTHY))
        .router(image=kind.images.router)
        .rollout(
            maxSurge=1,
            maxUnavailable=0,
            drainSeconds=3,
            canary={"percent": 50, "autoPromote": True},
        )
        # An engine stops 30 s short of its grace period: the 20 s left over cover a router's
        # roll when the Deployment controller itself replaces pods in a role-local roll (step 5).
        .set(pod={"terminationGracePeriodSeconds": 50})
        .set(verification={"probeRequestsPerMinute": 60})
        .dict()
    )


def verify(kind: Kind, namespace: str, timeout: float = 0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PDMTP), "verify", NAME, "-n", namespace, "--kubeconfig", str(kind.kubeconfig),
         "--timeout", str(timeout)],
        capture_output=True,
        text=True,
        timeout=timeout + 60,
    )  # fmt: skip


def patch(kind: Kind, namespace: str, body: dict[str, Any]) -> None:
    kind.kubectl(
        "-n", namespace, "patch", "pddeployment", NAME, "--type=merge", "-p", json.dumps(body)
    )


def revisions(kind: Kind, namespace: str) -> set[str]:
    """The revisions with pods that are not stopping (a retired revision's router stopped first:
    its pods' preStop serves nothing)."""
    return {
        p["metadata"]["labels"][LABEL_REVISION]
        for p in kind.pods(namespace, f"{LABEL_NAME}={NAME}")
        if LABEL_REVISION in p["metadata"]["labels"] and not p["metadata"].get("deletionTimestamp")
    }


def pod_uids(kind: Kind, namespace: str, revision: str) -> set[str]:
    selector = f"{LABEL_NAME}={NAME},{LABEL_REVISION}={revision}"
    return {p["metadata"]["uid"] for p in kind.pods(namespace, selector)}


def rolled_back(kind: Kind, namespace: str, serving: str) -> dict[str, Any] | None:
    record = kind.pdd(namespace, NAME).get("status", {}).get("rollout") or {}
    done = record.get("phase") == "RolledBack" and revisions(kind, namespace) == {serving}
    return record if done else None


def knobs(**values: str) -> list[dict[str, str]]:
    """The emulator's env for these knobs (`pull_failure_rate` -> PDMTP_EMULATOR_PULL_...)."""
    return [{"name": f"PDMTP_EMULATOR_{k.upper()}", "value": v} for k, v in values.items()]


def faulty(revision: str, **values: str) -> dict[str, Any]:
    """A patch to `revision` whose decodes take these knobs; the whole env is replaced, so the
    classes' rates are in it (`HEALTHY` unless given)."""
    env = knobs(**{"class_acceptance": HEALTHY, **values})
    return {"spec": {"model": {"revision": revision}, "decode": {"env": env}}}


def test_1_a_healthy_revision_is_verified(kind: Kind, namespace: str) -> None:
    kind.apply(spec_for(kind), namespace)
    kind.wait_condition(namespace, NAME, "Available", timeout=240)
    state["serving"] = kind.pdd(namespace, NAME)["status"]["currentRevision"]
    run = LoadRun.start(
        kind, namespace, NAME, max_requests=60, max_seconds=120, request_classes=MIXED
    )
    summary = run.summary()
    assert summary["failed"] == 0, summary["errors"]
    done = verify(kind, namespace, timeout=60)
    assert done.returncode == EXIT_VERIFIED, done.stdout + done.stderr
    assert state["serving"] in done.stdout and reasons.HANDOFF_VERIFIED in done.stdout


def under_load(
    kind: Kind,
    namespace: str,
    change: dict[str, Any] | Callable[[], None],
    until: Any,
    what: str,
) -> Any:
    """Apply `change` (a patch of the PDDeployment, or a function that makes the change) while a
    bounded request loop runs; wait for `until`; the loop's summary and what `until` returned,
    with the seconds it took."""
    run = LoadRun.start(
        kind, namespace, NAME, max_requests=20_000, max_seconds=400, request_classes=MIXED
    )
    run.wait_sending()
    started = time.monotonic()
    if callable(change):
        change()
    else:
        patch(kind, namespace, change)
    found = wait_for(until, what, 300, every=2.0)
    seconds = round(time.monotonic() - started, 1)
    run.wait_answers()
    run.stop()
    summary = run.summary()
    counts = {k: summary[k] for k in ("sent", "ok", "failed", "cross_revision", "classes")}
    print(f"\n{what}: {seconds}s, {json.dumps(counts)}")
    return summary, found, seconds


def served_by(summary: dict[str, Any], revision: str) -> int:
    """Answers whose decode or prefill was of `revision` (a pair is
    `decode-revision<-prefill-revision k=..`)."""
    served = 0
    for pair, count in summary["pairs"].items():
        decode, _, rest = pair.partition("<-")
        if revision in (decode, rest.split(" ", 1)[0]):
            served += count
    return served


def test_2_a_canary_accepting_fewer_drafts_is_rolled_back(kind: Kind, namespace: str) -> None:
    serving = state["serving"]
    summary, record, seconds = under_load(
        kind,
        namespace,
        faulty("r2", class_acceptance=WORSE),
        lambda: rolled_back(kind, namespace, serving),
        "the canary rolled back",
    )
    bad, answered = served_by(summary, record["failedRevision"]), summary["ok"]
    print(
        f"mixed 15%-worse canary rolled back: {seconds} s, bad revision served {bad:,} of "
        f"{answered:,} ({100 * bad / max(answered, 1):.1f} %)"
    )
    assert summary["failed"] == 0, summary["errors"]
    assert summary["cross_revision"] == 0, summary["pairs"]
    assert record["failedVerdict"] == reasons.ACCEPTANCE_REGRESSED, record
    done = verify(kind, namespace)
    assert done.returncode == EXIT_FAILED, done.stdout + done.stderr
    assert reasons.ACCEPTANCE_REGRESSED in done.stdout


def test_3_gated_pulls_failing_never_retire_the_old_revision(kind: Kind, namespace: str) -> None:
    serving = state["serving"]
    before = pod_uids(kind, namespace, serving)
    change = faulty("r3", pull_failure_rate="0.5")
    change["spec"].update(verification={"mode": "Gate"}, rollout={"canary": None})
    summary, record, _ = under_load(
        kind,
        namespace,
        change,
        lambda: rolled_back(kind, namespace, serving),
        "the paired roll rolled back",
    )
    # A failed pull is recomputed by the decode: the request is answered (200), and the load
    # client, which checks each answer's KV provenance, sees that it carries none.
    assert all(e.startswith("no KV provenance") for e in summary["errors"]), summary["errors"]
    assert summary["ok"] > 0
    assert summary["cross_revision"] == 0, summary["pairs"]
    assert record["failedVerdict"] == reasons.KV_PULL_FAILED, record
    assert pod_uids(kind, namespace, serving) == before, "the old revision lost a pod"
    done = verify(kind, namespace)
    assert done.returncode == EXIT_FAILED and reasons.KV_PULL_FAILED in done.stdout, done.stdout


def test_4_a_healthy_canary_promotes_itself(kind: Kind, namespace: str) -> None:
    serving = state["serving"]
    change = faulty("r4")
    change["spec"]["rollout"] = {"canary": {"percent": 50, "autoPromote": True}}

    def complete() -> str | None:
        status = kind.pdd(namespace, NAME).get("status", {})
        new = status.get("currentRevision")
        done = (status.get("rollout") or {}).get("phase") == "Complete"
        return new if done and new != serving and revisions(kind, namespace) == {new} else None

    summary, new, seconds = under_load(kind, namespace, change, complete, "the canary promoted")
    assert summary["failed"] == 0, summary["errors"]
    assert summary["cross_revision"] == 0, summary["pairs"]
    done = verify(kind, namespace, timeout=60)
    assert done.returncode == EXIT_VERIFIED, done.stdout + done.stderr
    assert new in done.stdout
    print(f"healthy canary completed in {seconds}s")


def decode_pods(kind: Kind, namespace: str) -> list[dict[str, Any]]:
    return [
        p
        for p in kind.pods(namespace, f"{LABEL_NAME}={NAME},{LABEL_ROLE}=decode")
        if not p["metadata"].get("deletionTimestamp")
    ]


def role_hashes(kind: Kind, namespace: str) -> set[str]:
    """The templates of the decode pods, stopping ones too (they serve through their preStop)."""
    pods = kind.pods(namespace, f"{LABEL_NAME}={NAME},{LABEL_ROLE}=decode")
    return {p["metadata"]["annotations"][ANNOTATION_ROLE_HASH] for p in pods}


def test_5_a_failing_decode_leaves_routing_at_once_and_is_replaced(
    kind: Kind, namespace: str
) -> None:
    serving = kind.pdd(namespace, NAME)["status"]["currentRevision"]
    patch(kind, namespace, {"spec": {"decode": {"replicas": 2}}})
    wait_for(
        lambda: len([p for p in decode_pods(kind, namespace) if serves(p)]) == 2,
        "two decodes serving",
        180,
    )
    # vLLM's default policy from here on: a failed pull fails its request. A role-local change
    # of the decodes: held at its first new decode, judged on it under load, and rolled through.
    old = role_hashes(kind, namespace)

    def rolled_through() -> bool:
        pods = decode_pods(kind, namespace)
        rolls = kind.pdd(namespace, NAME).get("status", {}).get("templateRolls")
        fresh = role_hashes(kind, namespace).isdisjoint(old)
        return fresh and not rolls and len(pods) == 2 and all(serves(p) for p in pods)

    policy = {"spec": {"kvTransfer": {"loadFailurePolicy": "fail"}}}
    summary, _, seconds = under_load(kind, namespace, policy, rolled_through, "the decodes rolled")
    print(f"role-local change (loadFailurePolicy fail) judged and rolled through in {seconds}s")
    assert summary["failed"] == 0, summary["errors"]
    assert summary["cross_revision"] == 0, summary["pairs"]
    said = kind.get(
        "-n", namespace, "events", "--field-selector", "involvedObject.kind=PDDeployment"
    )
    reasons_said = {e["reason"] for e in said["items"]}
    assert {reasons.TEMPLATE_HELD, reasons.TEMPLATE_VERIFIED} <= reasons_said, reasons_said

    bad = decode_pods(kind, namespace)[0]
    name, uid = bad["metadata"]["name"], bad["metadata"]["uid"]

    def replaced() -> str | None:
        pods = decode_pods(kind, namespace)
        gone = all(p["metadata"]["uid"] != uid for p in pods)
        new = [p["metadata"]["name"] for p in pods if p["metadata"]["name"] != name]
        return new[-1] if gone and len(pods) == 2 and all(serves(p) for p in pods) else None

    def fail_pulls() -> None:
        tuning = kind.pod_json(namespace, name, 8000, "emulator/config", {"pull_failure_rate": 1})
        assert tuning["pull_failure_rate"] == 1, tuning

    summary, new, seconds = under_load(kind, namespace, fail_pulls, replaced, "the decode replaced")
    # Under fail, each pull the pod failed failed its request, until it left routing.
    assert summary["cross_revision"] == 0, summary["pairs"]
    assert kind.pdd(namespace, NAME)["status"]["currentRevision"] == serving
    events = kind.get(
        "-n", namespace, "events", "--field-selector", f"reason={reasons.REPLACING_POD}"
    )
    assert any(name in e["message"] for e in events["items"]), events["items"]
    done = verify(kind, namespace, timeout=90)
    assert done.returncode == EXIT_VERIFIED, done.stdout + done.stderr
    print(
        f"decode {name} replaced by {new} in {seconds}s; under loadFailurePolicy fail "
        f"{summary['failed']} of {summary['sent']} requests failed"
    )
    patch(kind, namespace, {"spec": {"decode": {"replicas": 1}}})
    wait_for(lambda: len(decode_pods(kind, namespace)) == 1, "one decode again", 180)


def probes_sent(kind: Kind, namespace: str, result: str) -> float:
    labels = f'name="{NAME}",namespace="{namespace}",result="{result}"'
    line = f"pdmtp_verification_probes_total{{{labels}}}"
    found = [x for x in kind.operator_metrics().splitlines() if x.startswith(line)]
    return float(found[0].split()[-1]) if found else 0.0


def test_6_a_canary_with_no_traffic_is_judged_on_the_operators_probes(
    kind: Kind, namespace: str
) -> None:
    """No client sends anything: the operator's own requests, through the canary's router,
    bring its verdict, and autoPromote completes the roll (a canary deployed at night)."""
    serving = kind.pdd(namespace, NAME)["status"]["currentRevision"]
    clients = kind.pods(namespace, "app.kubernetes.io/name=pdmtp-e2e-load")
    assert not [p for p in clients if p["status"].get("phase") == "Running"], "a client runs"
    before = probes_sent(kind, namespace, "ok")
    started = time.monotonic()
    patch(kind, namespace, faulty("r6"))

    def complete() -> str | None:
        status = kind.pdd(namespace, NAME).get("status", {})
        new = status.get("currentRevision")
        done = (status.get("rollout") or {}).get("phase") == "Complete"
        return new if done and new != serving and revisions(kind, namespace) == {new} else None

    new = wait_for(complete, "the canary promoted on probes", 300, every=2.0)
    seconds = round(time.monotonic() - started, 1)
    sent = probes_sent(kind, namespace, "ok") - before
    assert sent >= 8, f"{sent} probes answered: fewer than minRequests"  # the verdict needs 8
    assert probes_sent(kind, namespace, "failed") == 0
    done = verify(kind, namespace, timeout=30)
    assert done.returncode == EXIT_VERIFIED and new in done.stdout, done.stdout + done.stderr
    print(f"\ncanary with no traffic promoted on {sent:g} probes in {seconds}s")


def test_7_a_role_local_change_without_the_fixed_connector_goes_back(
    kind: Kind, namespace: str
) -> None:
    """Mode Gate, under load: a decode env change (role-local: no new revision) whose engine
    lacks the fixed connector is held at its first new decode, judged on it, and the decodes go
    back to the Verified template, the old decode serving throughout (issue 50, item 3)."""
    serving = kind.pdd(namespace, NAME)["status"]["currentRevision"]
    before = {p["metadata"]["uid"] for p in decode_pods(kind, namespace)}
    env = knobs(class_acceptance=HEALTHY, fixed_connector="0")
    change = {"spec": {"verification": {"mode": "Gate"}, "decode": {"env": env}}}

    def went_back() -> dict[str, Any] | None:
        status = kind.pdd(namespace, NAME).get("status", {})
        failed = [r for r in status.get("templateRolls") or [] if r["phase"] == "Failed"]
        now = {p["metadata"]["uid"] for p in decode_pods(kind, namespace)}
        return failed[0] if failed and now == before else None

    summary, roll, seconds = under_load(kind, namespace, change, went_back, "the template back")
    print(
        f"role-local change without the fixed connector: back in {seconds} s, "
        f"{summary['sent']:,} sent, {summary['failed']} failed, "
        f"{summary['cross_revision']} cross-revision"
    )
    assert roll["reason"] == reasons.HANDOFF_NOT_REPORTED, roll
    assert summary["failed"] == 0, summary["errors"]
    assert summary["cross_revision"] == 0, summary["pairs"]
    assert kind.pdd(namespace, NAME)["status"]["currentRevision"] == serving
    done = verify(kind, namespace)
    assert done.returncode == EXIT_FAILED, done.stdout + done.stderr
    assert reasons.HANDOFF_NOT_REPORTED in done.stdout

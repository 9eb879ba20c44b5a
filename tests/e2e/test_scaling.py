"""kind e2e: scaling and a canary hold lose no request, because a pod leaves its routers before it
leaves the cluster (`core.rollout.removal`). Real router, emulated engines on the real node, the
in-cluster load client opening a new connection per request.

- the scale sequence 1P/1D -> 1P/3D -> 2P/3D -> 2P/1D -> 1P/1D under load: 0 failed, 0 cross;
- a 2P/2D canary at 50% held under load (its measured share of answers beside
  status.rollout.canaryTrafficPercent), then promoted: 0 failed, 0 cross.
"""

from __future__ import annotations

import time
from typing import Any

from builders import pdd
from e2e.kindkit import Figures, Kind, LoadRun, patch_pdd, serving, wait_for
from pdmtp.api.vocabulary import (
    ANNOTATION_PROMOTE,
    LABEL_NAME,
    LABEL_ROLE,
)

NAME = "elastic"
record = Figures("PDMTP_E2E_SCALING_RESULT").record


def spec_for(kind: Kind, prefill: int, decode: int) -> dict[str, Any]:
    return (
        pdd(NAME)
        .set(image=kind.images.emulator, model={"name": kind.images.engine_model})
        .mtp(3, modules=3, method="deepseek_mtp")
        .prefill(replicas=prefill)
        .decode(replicas=decode)
        # The kind node has the machine's 2 cores: a canary runs two revisions' routers, and
        # each roll adds one more for a moment.
        .router(image=kind.images.router, resources={"requests": {"cpu": "100m"}})
        .rollout(maxSurge=1, maxUnavailable=0, drainSeconds=3)
        # Emulated engines stop at once: 3 s of serving after they are told to stop.
        .set(pod={"terminationGracePeriodSeconds": 33})
        .unjudged()  # its rolls carry no load to judge them by
        .dict()
    )


def engine_pods(kind: Kind, namespace: str, role: str) -> list[dict[str, Any]]:
    return kind.pods(namespace, f"{LABEL_NAME}={NAME},{LABEL_ROLE}={role}")


def settled_at(kind: Kind, namespace: str, prefill: int, decode: int) -> bool:
    """Exactly the wanted engine pods, all ready and none leaving or terminating, and the
    PDDeployment Available and not progressing."""
    for role, want in (("prefill", prefill), ("decode", decode)):
        pods = engine_pods(kind, namespace, role)
        if len(pods) != want:
            return False
        if not all(serving(pod) for pod in pods):
            return False
    return kind.settled(namespace, NAME)


def patch(kind: Kind, namespace: str, body: dict[str, Any]) -> None:
    patch_pdd(kind, namespace, NAME, body)


def test_1_scaling_under_load_loses_no_request(kind: Kind, namespace: str) -> None:
    kind.apply(spec_for(kind, 1, 1), namespace)
    wait_for(lambda: settled_at(kind, namespace, 1, 1), "1P/1D serving", 240)
    revision = kind.pdd(namespace, NAME)["status"]["currentRevision"]

    run = LoadRun.start(kind, namespace, NAME, max_requests=40_000, max_seconds=540)
    run.wait_sending()
    steps = []
    for prefill, decode in ((1, 3), (2, 3), (2, 1), (1, 1)):
        started = time.monotonic()
        patch(
            kind,
            namespace,
            {"spec": {"prefill": {"replicas": prefill}, "decode": {"replicas": decode}}},
        )
        wait_for(
            lambda p=prefill, d=decode: settled_at(kind, namespace, p, d),
            f"{prefill}P/{decode}D",
            240,
        )
        steps.append(
            {"to": f"{prefill}P/{decode}D", "seconds": round(time.monotonic() - started, 1)}
        )
    run.wait_answers()  # at 1P/1D, the sequence's end
    run.stop()
    summary = run.summary()
    record(
        "scale sequence under load",
        {
            "steps": steps,
            "requests_sent": summary["sent"],
            "requests_failed": summary["failed"],
            "cross_revision": summary["cross_revision"],
            "errors": summary["errors"],
            "load_seconds": summary["seconds"],
        },
    )
    assert summary["stopped_by"] == "stop file", "the loop ended before the sequence did"
    assert summary["failed"] == 0, summary["errors"]
    assert summary["cross_revision"] == 0, summary["pairs"]
    assert set(summary["pairs"]) == {f"{revision}<-{revision} k=3<-3"}


def test_2_a_canary_hold_and_its_promotion_lose_no_request(kind: Kind, namespace: str) -> None:
    kind.apply(spec_for(kind, 1, 1), namespace)  # stands alone; test_1 ends at this spec
    patch(kind, namespace, {"spec": {"prefill": {"replicas": 2}, "decode": {"replicas": 2}}})
    wait_for(lambda: settled_at(kind, namespace, 2, 2), "2P/2D serving", 240)
    old = kind.pdd(namespace, NAME)["status"]["currentRevision"]

    run = LoadRun.start(kind, namespace, NAME, max_requests=40_000, max_seconds=540)
    run.wait_sending()
    patch(
        kind,
        namespace,
        {
            "spec": {
                "speculative": {"numSpeculativeTokens": 2},
                "rollout": {"canary": {"percent": 50}},
            }
        },
    )

    def held() -> dict[str, Any] | None:
        rollout = kind.pdd(namespace, NAME).get("status", {}).get("rollout") or {}
        return rollout if rollout.get("phase") == "CanaryHold" else None

    rollout = wait_for(held, "the canary hold", 240)
    new = rollout["revision"]
    # The hold's traffic alone: a second client, started once the hold stands.
    hold = LoadRun.start(kind, namespace, NAME, max_requests=4_000, max_seconds=40)
    hold_summary = hold.summary(timeout=120)
    share = 100 * hold_summary["pairs"].get(f"{new}<-{new} k=2<-2", 0) / max(hold_summary["ok"], 1)
    endpoints = (held() or rollout).get("canaryTrafficPercent")

    started = time.monotonic()
    kind.kubectl(
        "-n",
        namespace,
        "annotate",
        "pddeployment",
        NAME,
        f"{ANNOTATION_PROMOTE}={new}",
        "--overwrite",
    )

    def done() -> bool:
        status = kind.pdd(namespace, NAME).get("status", {})
        return (
            status.get("currentRevision") == new
            and settled_at(kind, namespace, 2, 2)
            and not kind.pods(namespace, f"{LABEL_NAME}={NAME},pdmtp.io/revision={old}")
        )

    wait_for(done, f"promotion of {new}", 300)
    promote_seconds = round(time.monotonic() - started, 1)
    run.wait_answers()  # on the promoted revision alone
    run.stop()
    summary = run.summary()
    record(
        "canary hold at 50% and promote under load",
        {
            "hold_requests": hold_summary["sent"],
            "hold_failed": hold_summary["failed"],
            "hold_share_new_percent": round(share, 1),
            "canary_traffic_percent": endpoints,
            "promote_seconds": promote_seconds,
            "requests_sent": summary["sent"],
            "requests_failed": summary["failed"],
            "cross_revision": summary["cross_revision"],
            "pairs": summary["pairs"],
            "errors": summary["errors"],
        },
    )
    assert hold_summary["failed"] == 0 and hold_summary["cross_revision"] == 0, hold_summary
    assert summary["failed"] == 0, summary["errors"]
    assert summary["cross_revision"] == 0, summary["pairs"]
    assert abs(share - 50) <= 15, f"the hold sent {share:.1f}% to the canary, not ~50%"
    assert set(summary["pairs"]) == {f"{old}<-{old} k=3<-3", f"{new}<-{new} k=2<-2"}

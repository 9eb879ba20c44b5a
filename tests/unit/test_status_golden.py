"""The status the operator writes, byte for byte, for a fixed set of situations.

The files under golden/status/ were recorded from the hand-built status dict that preceded the typed
status builder (core/status/builder.py); the builder must reproduce them exactly. Re-record only on
a deliberate status change: `PDMTP_RECORD_GOLDEN=1 pytest tests/unit/test_status_golden.py`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from builders import PDDBuilder, pdd
from fake_cluster import FakeCluster

GOLDEN = Path(__file__).parent / "golden" / "status"
NOW = 1_800_000_000.0


def body(b: PDDBuilder, generation: int = 1) -> dict[str, Any]:
    obj = b.dict()
    obj["metadata"].update(namespace="ns", uid="u-1", generation=generation)
    return obj


def serving(b: PDDBuilder) -> FakeCluster:
    """A PDDeployment rolled out and serving, every pod ready."""
    fc = FakeCluster(body(b))
    fc.reconcile(NOW)
    fc.run_pods()
    fc.reconcile(NOW + 1)
    fc.run_pods()
    fc.reconcile(NOW + 2)
    return fc


def respec(fc: FakeCluster, b: PDDBuilder, generation: int) -> None:
    status = fc.body.get("status")
    fc.body = body(b, generation)
    if status is not None:
        fc.body["status"] = status


def created() -> dict[str, Any]:
    return FakeCluster(body(pdd("x").mtp(3, modules=3))).reconcile(NOW).status


def settled() -> dict[str, Any]:
    b = pdd("x").mtp(3, modules=3).prefill(replicas=2).decode(replicas=2)
    fc = serving(b)
    return fc.reconcile(NOW + 3).status


def incompatible() -> dict[str, Any]:
    fc = serving(pdd("x").mtp(3))
    respec(fc, pdd("x").mtp(3).prefill(k=2), 2)
    return fc.reconcile(NOW + 10).status


def mid_rollout() -> dict[str, Any]:
    old = pdd("x").mtp(3, modules=3).prefill(replicas=2).decode(replicas=2)
    fc = serving(old)
    respec(fc, pdd("x").mtp(2, modules=3).prefill(replicas=2).decode(replicas=2), 2)
    fc.reconcile(NOW + 10)
    fc.run_pods()
    return fc.reconcile(NOW + 11).status


def draining() -> dict[str, Any]:
    # Report: no verdict holds the old revision (these pods publish no metrics).
    old = pdd("x").mtp(3, modules=3).rollout(drainSeconds=30).set(verification={"mode": "Report"})
    fc = serving(old)
    new = pdd("x").mtp(2, modules=3).rollout(drainSeconds=30).set(verification={"mode": "Report"})
    respec(fc, new, 2)
    for t in range(10, 16):
        fc.reconcile(NOW + t)
        fc.run_pods()
    return fc.reconcile(NOW + 16).status


def unschedulable() -> dict[str, Any]:
    fc = serving(pdd("x").mtp(3, modules=3))
    respec(fc, pdd("x").mtp(2, modules=3), 2)
    fc.reconcile(NOW + 10)
    fc.run_pods(ready=False)
    for pod in fc.pods.values():
        if pod["status"]["conditions"][0]["status"] == "False":
            pod["status"] = {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
                    }
                ],
            }
    return fc.reconcile(NOW + 11).status


def engine_refused() -> dict[str, Any]:
    fc = FakeCluster(body(pdd("x").mtp(3, modules=3)))
    fc.reconcile(NOW)
    fc.run_pods(ready=False)
    pod = fc.pods_of("prefill")[0]
    pod["status"]["containerStatuses"] = [
        {
            "name": "engine",
            "restartCount": 2,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {
                "terminated": {
                    "exitCode": 3,
                    "message": "lookahead mismatch: operator expects 3, vLLM computes 1",
                }
            },
        }
    ]
    return fc.reconcile(NOW + 5).status


def unusable() -> dict[str, Any]:
    fc = serving(pdd("x"))
    broken = body(pdd("x"), 2)
    broken["spec"]["prefill"]["replicas"] = "many"
    broken["status"] = fc.body["status"]
    fc.body = broken
    return fc.reconcile(NOW + 10).status


SCENARIOS: dict[str, Callable[[], dict[str, Any]]] = {
    f.__name__: f
    for f in (
        created,
        settled,
        incompatible,
        mid_rollout,
        draining,
        unschedulable,
        engine_refused,
        unusable,
    )
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_status_matches_the_recording(scenario: str) -> None:
    got = json.dumps(SCENARIOS[scenario](), indent=1) + "\n"
    path = GOLDEN / f"{scenario}.json"
    if os.environ.get("PDMTP_RECORD_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
    assert got == path.read_text()

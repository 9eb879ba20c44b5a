"""spec.autoscaling through `core.reconcile.decide`: scraped metrics in, the engine Deployments'
replicas, the autoscaling status and its events out (core.scaling bridges spec, status and the
pure decision of core.scaling.autoscaler)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from builders import PDDBuilder, pdd
from pdmtp.api import reasons
from pdmtp.api import vocabulary as v
from pdmtp.core.actions import Annotate, Apply, Delete, SetStatus
from pdmtp.core.context import Observed
from pdmtp.core.promtext import Scrape
from pdmtp.core.reconcile import Decision, decide
from pdmtp.core.windows import PodMetrics
from test_reconcile import applied, body, pods_for, split

NOW = 1_800_000_000.0
FAST = {
    "scaleUp": {"stabilizationWindowSeconds": 0},
    "scaleDown": {"stabilizationWindowSeconds": 0},
}


def autoscaled(
    decode: dict[str, Any], prefill: dict[str, Any] | None = None, **more: Any
) -> PDDBuilder:
    auto: dict[str, Any] = {"decode": decode, "intervalSeconds": 15, **more}
    if prefill is not None:
        auto["prefill"] = prefill
    return pdd("x").prefill(replicas=1).decode(replicas=2).set(autoscaling=auto)


@dataclass
class World:
    """A PDDeployment's children as the API server would hold them after each decision."""

    b: PDDBuilder
    objs: dict[str, dict[str, Any]] = field(default_factory=dict)
    status: dict[str, Any] | None = None
    now: float = NOW

    def step(self, metrics: dict[str, PodMetrics] | None = None, seconds: float = 0) -> Decision:
        self.now += seconds
        deployments, others = split(self.objs)
        pods = [p for d in deployments for p in pods_for(d)]
        d = decide(
            Observed(body(self.b, self.status), deployments, pods, others, metrics or {}),
            self.now,
        )
        self.objs.update(applied(d))
        self.status = d.status
        return d

    def settle(self) -> None:
        for _ in range(4):
            self.step(seconds=1)

    def pods(self, role: str) -> list[str]:
        deployments, _ = split(self.objs)
        return [
            p["metadata"]["name"]
            for d in deployments
            for p in pods_for(d)
            if p["metadata"]["labels"][v.LABEL_ROLE] == role
        ]

    def replicas(self, role: str) -> int:
        deployments, _ = split(self.objs)
        return sum(
            d["spec"]["replicas"]
            for d in deployments
            if d["spec"]["template"]["metadata"]["labels"].get(v.LABEL_ROLE) == role
        )

    def role_status(self, role: str) -> dict[str, Any]:
        assert self.status is not None
        roles = self.status["autoscaling"]["roles"]
        found: dict[str, Any] = next(r for r in roles if r["name"] == role)
        return found


def decode_metrics(w: World, kv: float, at: float | None = None) -> dict[str, PodMetrics]:
    at = w.now if at is None else at
    return {
        pod: PodMetrics(
            Scrape(at, kv_cache_usage=kv, running=1.0), Scrape(at - 15, kv_cache_usage=kv)
        )
        for pod in w.pods("decode")
    }


def kv_only(**extra: Any) -> dict[str, Any]:
    return {
        "minReplicas": 1,
        "maxReplicas": 6,
        "targets": [{"signal": "kvCacheUsage", "value": 0.5}],
        "behavior": FAST,
        **extra,
    }


def test_load_scales_decode_up_within_the_same_revision_and_says_why() -> None:
    w = World(autoscaled(kv_only()))
    w.settle()
    revision = w.status["currentRevision"]  # type: ignore[index]
    assert w.replicas("decode") == 2
    d = w.step(decode_metrics(w, kv=1.0), seconds=15)
    # ceil(2 pods * 1.0 / 0.5) = 4, within the default step (+2 or +100%).
    assert w.role_status("decode")["desiredReplicas"] == 4
    assert w.role_status("decode")["decidingSignal"] == "kvCacheUsage"
    assert w.replicas("decode") == 4
    assert w.status["currentRevision"] == revision and w.status["updateRevision"] == revision  # type: ignore[index]
    (event,) = [e for e in d.events if e.reason == reasons.AUTOSCALED_UP]
    assert event.message.startswith("decode scale up 2 -> 4")
    assert "kvCacheUsage" in event.message
    assert d.requeue_after is not None and d.requeue_after <= 15
    decode = next(r for r in d.status["roles"] if r["name"] == "decode")
    assert decode["desiredReplicas"] == 4 and d.status["decode"].endswith("/4")


def test_between_two_evaluations_nothing_moves() -> None:
    w = World(autoscaled(kv_only()))
    w.settle()
    w.step(decode_metrics(w, kv=1.0), seconds=15)
    d = w.step(decode_metrics(w, kv=0.0), seconds=3)
    assert w.role_status("decode")["desiredReplicas"] == 4
    assert not [e for e in d.events if e.reason.startswith("Autoscaled")]
    assert d.requeue_after is not None and 11 <= d.requeue_after <= 12


def test_no_scale_down_on_missing_metrics() -> None:
    w = World(autoscaled(kv_only()))
    w.settle()
    w.step(decode_metrics(w, kv=1.0), seconds=15)
    silent = decode_metrics(w, kv=0.0)
    silent.pop(w.pods("decode")[0])  # one Ready pod never answered
    w.step(silent, seconds=15)
    status = w.role_status("decode")
    assert status["desiredReplicas"] == 4
    assert "no scale-down on missing or stale metrics" in status["reason"]
    stale = decode_metrics(w, kv=0.0, at=w.now - 120)  # every scrape older than 60 s
    w.step(stale, seconds=15)
    assert w.role_status("decode")["desiredReplicas"] == 4
    # Fresh again, a period after the scale-up: down, one pod a minute (the default limit).
    w.step(decode_metrics(w, kv=0.0), seconds=45)
    assert w.role_status("decode")["desiredReplicas"] == 3


def test_the_ratio_band_holds_decode_to_the_fixed_prefill() -> None:
    w = World(autoscaled(kv_only(), ratio={"min": 0.5, "max": 2}))
    w.settle()
    w.step(decode_metrics(w, kv=1.0), seconds=15)
    status = w.role_status("decode")
    # prefill stays at 1 (not autoscaled): decode may not pass 1 / 0.5 = 2.
    assert status["desiredReplicas"] == 2 and status["recommendation"] == 4
    assert "prefill:decode band [0.5, 2]" in w.status["autoscaling"]["ratioNote"]  # type: ignore[index]


def test_history_survives_in_status_so_the_scale_down_window_holds_across_reconciles() -> None:
    slow = {
        "scaleUp": {"stabilizationWindowSeconds": 0},
        "scaleDown": {"stabilizationWindowSeconds": 60},
    }
    w = World(autoscaled(kv_only(behavior=slow)))
    w.settle()
    w.step(decode_metrics(w, kv=1.0), seconds=15)
    assert w.role_status("decode")["desiredReplicas"] == 4
    up = w.now
    desired = []
    for _ in range(6):  # idle: the 60 s window holds the high recommendation, then it goes
        w.step(decode_metrics(w, kv=0.0), seconds=15)
        desired.append((w.now - up, w.role_status("decode")["desiredReplicas"]))
    assert all(count == 4 for elapsed, count in desired if elapsed <= 60), desired
    assert desired[-1] == (90, 3), desired  # then one pod a minute
    assert w.role_status("decode")["lastScaleTime"] is not None


def test_a_lowered_max_applies_at_once() -> None:
    w = World(autoscaled(kv_only()))
    w.settle()
    w.step(decode_metrics(w, kv=1.0), seconds=15)
    w.b = autoscaled(kv_only(maxReplicas=3))
    d = w.step(decode_metrics(w, kv=1.0), seconds=1)
    assert w.role_status("decode")["desiredReplicas"] == 3
    # The scale-down starts at once, the lossless way: a pod leaves routing first.
    assert leaving_marks(d) == 1


def leaving_marks(d: Decision) -> int:
    return sum(1 for a in d.actions if isinstance(a, Annotate) and a.leaving)


def role_scale(replicas: int) -> dict[str, Any]:
    return {
        "kind": v.ROLE_SCALE_KIND,
        "apiVersion": v.API_VERSION,
        "metadata": {
            "name": "x-decode",
            "namespace": "ns",
            "labels": {v.LABEL_NAME: "x", v.LABEL_ROLE: "decode"},
        },
        "spec": {"replicas": replicas},
    }


@pytest.mark.parametrize(("asked", "desired"), [(3, 3), (9, 5), (0, 1)])
def test_an_external_role_follows_its_scale_endpoint_within_min_and_max(
    asked: int, desired: int
) -> None:
    w = World(autoscaled({"source": "External", "minReplicas": 1, "maxReplicas": 5}))
    w.settle()
    w.objs["PDRoleScale/x-decode"] = role_scale(asked)
    d = w.step(seconds=1)  # at once, not at the next interval
    assert w.role_status("decode")["desiredReplicas"] == desired
    assert w.role_status("decode")["source"] == "External"
    if desired > 2:
        assert w.replicas("decode") == desired
    else:  # a scale-down: the pod leaves routing before its Deployment shrinks
        assert leaving_marks(d) == 2 - desired


def test_without_autoscaling_there_is_no_autoscaling_status() -> None:
    w = World(pdd("x"))
    w.settle()
    assert "autoscaling" not in (w.status or {})


def test_scaling_never_writes_a_new_template() -> None:
    w = World(autoscaled(kv_only()))
    w.settle()
    d = w.step(decode_metrics(w, kv=1.0), seconds=15)
    engine = [a for a in d.actions if isinstance(a, Apply) and a.key.endswith("-decode")]
    assert engine, "the scale-up is written"
    assert all(a.exists for a in engine)


def test_an_external_role_gets_a_scale_endpoint_with_its_selector_and_loses_it_after() -> None:
    w = World(autoscaled({"source": "External", "minReplicas": 1, "maxReplicas": 5}))
    first = w.step()
    (created,) = [a for a in first.actions if isinstance(a, Apply) and a.kind == "PDRoleScale"]
    assert created.key == "PDRoleScale/x-decode" and created.manifest["spec"] == {"replicas": 2}
    owner = created.manifest["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "PDDeployment" and owner["controller"] is True
    w.settle()
    d = w.step(seconds=1)
    assert not [a for a in d.actions if isinstance(a, Apply) and a.kind == "PDRoleScale"]
    (status,) = [a for a in d.actions if isinstance(a, SetStatus)]
    assert status.status == {"replicas": 2, "selector": "pdmtp.io/name=x,pdmtp.io/role=decode"}
    w.objs["PDRoleScale/x-decode"]["status"] = dict(status.status)
    assert not [a for a in w.step(seconds=1).actions if isinstance(a, SetStatus)]
    w.b = autoscaled(kv_only())  # back to the operator's own scaler
    d = w.step(seconds=1)
    assert [a.key for a in d.actions if isinstance(a, Delete)] == ["PDRoleScale/x-decode"]


def test_a_scale_up_leaves_the_deployment_available_while_the_new_pods_start() -> None:
    w = World(autoscaled(kv_only(minReplicas=2)))
    w.settle()
    d = w.step(decode_metrics(w, kv=1.0), seconds=15)
    assert w.role_status("decode")["desiredReplicas"] == 4
    available = next(c for c in d.status["conditions"] if c["type"] == "Available")
    # 2 Ready decode pods of 4 wanted: at the declared minimum, so still Available.
    assert available["status"] == "True", available

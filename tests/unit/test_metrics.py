"""The operator's metrics (operator/pdmtp/metrics.py) from a reconcile's decision and report: the
series the chart's alerts select on (conditions, desired pods, rollbacks, the autoscaler's
coverage), what replaces them when the status changes, and what forget() drops."""

from __future__ import annotations

from typing import Any, Literal

from pdmtp.api import reasons
from pdmtp.api.status import (
    AutoscalingStatus,
    Condition,
    PDDeploymentStatus,
    RoleScaling,
    RoleStatus,
    SignalValue,
)
from pdmtp.core.actions import Event
from pdmtp.core.reconcile import Decision
from pdmtp.core.status.report import Report
from pdmtp.metrics import Metrics

NS, NAME = "serving", "llm"
STAMP = "2026-12-03T00:00:00Z"


def condition(type_: str, status: Literal["True", "False", "Unknown"], reason: str) -> Condition:
    return Condition(type=type_, status=status, reason=reason, last_transition_time=STAMP)


def report(
    conditions: list[Condition],
    events: tuple[Event, ...] = (),
    autoscaling: AutoscalingStatus | None = None,
) -> Report:
    """A report as the core makes it: the typed status and its dump (camelCase, no None)."""
    status = PDDeploymentStatus(
        conditions=conditions,
        roles=[
            RoleStatus(name="prefill", ready_replicas=1, desired_replicas=2),
            RoleStatus(name="decode", ready_replicas=3, desired_replicas=3),
        ],
        autoscaling=autoscaling,
    )
    dumped: dict[str, Any] = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    return Report(status=status, written=dumped, status_changed=True, events=events)


def observe(metrics: Metrics, r: Report) -> None:
    metrics.observe(NS, NAME, Decision(actions=(), requeue_after=None), r, (), 0.01)


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"namespace": NS, "name": NAME, **labels})


def series(metrics: Metrics, family: str) -> list[dict[str, str]]:
    return [
        dict(s.labels)
        for f in metrics.registry.collect()
        if f.name == family
        for s in f.samples
        if s.name == family
    ]


def test_each_current_condition_is_one_series_and_a_changed_reason_replaces_the_old() -> None:
    metrics = Metrics()
    observe(
        metrics,
        report(
            [
                condition(reasons.AVAILABLE, "True", reasons.MINIMUM_REPLICAS_AVAILABLE),
                condition(reasons.PROGRESSING, "True", reasons.ROLLOUT_IN_PROGRESS),
            ]
        ),
    )
    progressing = {"type": reasons.PROGRESSING, "status": "True"}
    assert value(metrics, "pdmtp_condition", **progressing, reason="RolloutInProgress") == 1
    observe(
        metrics,
        report(
            [
                condition(reasons.AVAILABLE, "True", reasons.MINIMUM_REPLICAS_AVAILABLE),
                condition(reasons.PROGRESSING, "False", reasons.PROGRESS_DEADLINE_EXCEEDED),
            ]
        ),
    )
    assert sorted(
        (s["type"], s["status"], s["reason"]) for s in series(metrics, "pdmtp_condition")
    ) == [
        ("Available", "True", "MinimumReplicasAvailable"),
        ("Progressing", "False", "ProgressDeadlineExceeded"),
    ]
    assert value(metrics, "pdmtp_condition", **progressing, reason="RolloutInProgress") is None


def test_desired_pods_per_role_beside_ready_pods() -> None:
    metrics = Metrics()
    observe(metrics, report([]))
    assert value(metrics, "pdmtp_desired_pods", role="prefill") == 2
    assert value(metrics, "pdmtp_ready_pods", role="prefill") == 1
    assert value(metrics, "pdmtp_desired_pods", role="decode") == 3


def test_rollbacks_count_the_rollback_event_from_zero() -> None:
    metrics = Metrics()
    observe(metrics, report([]))
    # At 0 before the first rollback, so rate() and increase() see the first one.
    assert value(metrics, "pdmtp_rollbacks_total") == 0
    assert value(metrics, "pdmtp_reconcile_errors_total") == 0
    assert value(metrics, "pdmtp_child_writes_refused_total") == 0
    back = Event("Warning", reasons.ROLLBACK_STARTED, "rolling back from b to a")
    other = Event("Warning", reasons.STALLED, "a pod cannot be placed")
    observe(metrics, report([], events=(back, other)))
    observe(metrics, report([], events=(other,)))
    assert value(metrics, "pdmtp_rollbacks_total") == 1


def scaling(coverage: Literal["full", "partial", "missing", "quiet"]) -> AutoscalingStatus:
    signal = SignalValue(signal="runningRequestsPerPod", target=4, coverage=coverage)
    role = RoleScaling(name="decode", source="Operator", desired_replicas=3, signals=[signal])
    return AutoscalingStatus(roles=[role])


def test_the_autoscalers_coverage_keeps_only_the_current_series() -> None:
    metrics = Metrics()
    observe(metrics, report([], autoscaling=scaling("missing")))
    signal = {"role": "decode", "signal": "runningRequestsPerPod"}
    assert value(metrics, "pdmtp_autoscaler_signal_coverage", **signal, coverage="missing") == 1
    # The signal came back: the missing series is gone, not left at a stale 1.
    observe(metrics, report([], autoscaling=scaling("full")))
    assert [s["coverage"] for s in series(metrics, "pdmtp_autoscaler_signal_coverage")] == ["full"]


def test_autoscaler_decisions_count_from_zero_per_autoscaled_role_and_direction() -> None:
    metrics = Metrics()
    observe(metrics, report([], autoscaling=scaling("full")))
    # Exported before the first decision (a dashboard or rule on it finds the series).
    for direction in ("up", "down"):
        labels = {"role": "decode", "direction": direction}
        assert value(metrics, "pdmtp_autoscaler_decisions_total", **labels) == 0
    up = Event("Normal", reasons.AUTOSCALED_UP, "decode scale up 3 -> 4: ...")
    observe(metrics, report([], events=(up,), autoscaling=scaling("full")))
    assert value(metrics, "pdmtp_autoscaler_decisions_total", role="decode", direction="up") == 1


def test_forget_drops_every_series_of_the_pddeployment() -> None:
    metrics = Metrics()
    conditions = [condition(reasons.DEGRADED, "True", reasons.ROLLED_BACK)]
    rollback = (Event("Warning", reasons.ROLLBACK_STARTED, "rolling back"),)
    observe(metrics, report(conditions, rollback, scaling("partial")))
    metrics.reconcile_errors.labels(NS, NAME).inc()
    named = [
        s.name
        for f in metrics.registry.collect()
        for s in f.samples
        if s.labels.get("name") == NAME
    ]
    assert {
        "pdmtp_condition",
        "pdmtp_desired_pods",
        "pdmtp_rollbacks_total",
        "pdmtp_autoscaler_decisions_total",
    } <= set(named)
    metrics.forget(NS, NAME)
    kept = {
        "pdmtp_reconcile_total",  # counters of what was done, as before
        "pdmtp_reconcile_created",
        "pdmtp_autoscaler_signal_value",
    }
    left = [
        s.name
        for f in metrics.registry.collect()
        for s in f.samples
        if s.labels.get("name") == NAME and s.name not in kept
    ]
    assert left == []
    # Observed again after forget: nothing stale is removed twice.
    observe(metrics, report(conditions))
    assert (
        value(metrics, "pdmtp_condition", type="Degraded", status="True", reason="RolledBack") == 1
    )

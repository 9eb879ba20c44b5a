"""Prometheus metrics of the operator: reconciles, their durations, validation failures by
reason, rollout progress, conditions and rollbacks per PDDeployment.

The chart's alert rules and dashboard (charts/pdmtp/files/) query these names; a unit test holds
every name they use to this registry (or to the engines' exposition)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, overload

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from pdmtp import __version__
from pdmtp.api import reasons
from pdmtp.api import vocabulary as v

if TYPE_CHECKING:
    from pdmtp.core.reconcile import Decision
    from pdmtp.core.status.report import Report

LABELS = ("namespace", "name")
CONDITION_LABELS = (*LABELS, "type", "status", "reason")
COVERAGE_LABELS = (*LABELS, "role", "signal", "coverage")
DIRECTIONS = ("up", "down")
PROBE_RESULTS = ("ok", "failed", "recorded")
"""The autoscaler's decisions, by the way they moved a role's desired count."""


C = TypeVar("C", Counter, Gauge, Histogram)


class Declared(Generic[C]):
    """One row of the metrics table (`Metrics`' class body): the collector's type, name, help and
    labels. Each `Metrics` holds its own collector for it, in its own registry."""

    def __init__(
        self,
        kind: type[C],
        name: str,
        documentation: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] | None = None,
    ) -> None:
        self.kind: type[C] = kind
        self.name, self.documentation, self.labels = name, documentation, labels
        self.buckets = buckets
        self.attr = ""

    def __set_name__(self, owner: type, attr: str) -> None:
        self.attr = attr

    def create(self, registry: CollectorRegistry) -> C:
        options: dict[str, Any] = {} if self.buckets is None else {"buckets": self.buckets}
        collector: C = self.kind(
            self.name, self.documentation, self.labels, registry=registry, **options
        )
        return collector

    @overload
    def __get__(self, metrics: None, owner: type) -> Declared[C]: ...
    @overload
    def __get__(self, metrics: Metrics, owner: type) -> C: ...
    def __get__(self, metrics: Metrics | None, owner: type) -> C | Declared[C]:
        return self if metrics is None else cast(C, metrics.__dict__[self.attr])


class Metrics:
    """The operator's metrics, declared as a table (one `Declared` each, in exposition order),
    in a registry of their own (tests build as many as they like)."""

    # The running build, as kube-state-metrics' *_info series: always 1, the version a label.
    build_info = Declared(
        Gauge, "pdmtp_build_info", "The pdmtp operator build that is running.", ("version",)
    )
    leader = Declared(
        Gauge,
        "pdmtp_leader",
        "1 while this operator process holds the leader Lease and reconciles; 0 while it"
        " stands by (always 1 when run without leader election).",
        ("identity",),
    )
    fenced_writes = Declared(
        Counter,
        "pdmtp_fenced_writes_total",
        "Writes not sent because this process does not hold the leader Lease (a standby,"
        " or a leader whose last renewal is older than the renew deadline).",
    )
    reconciles = Declared(Counter, "pdmtp_reconcile_total", "Reconciles run.", LABELS)
    reconcile_errors = Declared(
        Counter, "pdmtp_reconcile_errors_total", "Reconciles that failed and were retried.", LABELS
    )
    duration = Declared(
        Histogram,
        "pdmtp_reconcile_duration_seconds",
        "Time to observe, decide, apply and report.",
        buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    )
    api_requests = Declared(
        Counter,
        "pdmtp_api_requests_total",
        "Kubernetes API requests of the reconciler, by verb (reads come from the caches).",
        ("verb",),
    )
    watch_requests = Declared(
        Counter,
        "pdmtp_watch_requests_total",
        "LIST and WATCH requests of the child caches' reflectors, by kind.",
        ("kind", "verb"),
    )
    watched = Declared(
        Gauge,
        "pdmtp_resource_watched",
        "1 while the operator's watch of the resource is open in the scope (namespace, or"
        " empty for all); 0 while the API server does not serve it or cannot be reached.",
        ("resource", "scope"),
    )
    cached_objects = Declared(
        Gauge, "pdmtp_cached_objects", "Child objects held by the watch-fed caches."
    )
    refused = Declared(
        Counter, "pdmtp_child_writes_refused_total", "Child writes the API server refused.", LABELS
    )
    stale_writes = Declared(
        Counter,
        "pdmtp_stale_writes_total",
        "Conditional writes (replicas, applies over a version, status) refused because the"
        " object changed since it was observed (the step stops and is planned again).",
    )
    writes = Declared(
        Counter,
        "pdmtp_child_writes_total",
        "Child objects created, updated, scaled or deleted.",
        (*LABELS, "action"),
    )
    validation_failures = Declared(
        Counter,
        "pdmtp_validation_failures_total",
        "Reconciles that found the spec incompatible, by reason.",
        (*LABELS, "reason"),
    )
    compatible = Declared(
        Gauge, "pdmtp_config_compatible", "1 when both roles agree on the MTP lookahead.", LABELS
    )
    revisions = Declared(
        Gauge, "pdmtp_revisions", "Revisions with workloads (2+ during a rollout).", LABELS
    )
    progress = Declared(
        Gauge,
        "pdmtp_rollout_progress_ratio",
        "Ready engine pods at the update revision over desired engine pods.",
        LABELS,
    )
    ready = Declared(
        Gauge, "pdmtp_ready_pods", "Ready pods by role (all revisions).", (*LABELS, "role")
    )
    desired = Declared(
        Gauge,
        "pdmtp_desired_pods",
        "Desired pods by role: spec.<role>.replicas or the autoscaler's count (status.roles).",
        (*LABELS, "role"),
    )
    # kube-state-metrics' style: one series per current condition, valued 1, so an alert can
    # select on the reason; a condition's previous reason is removed, not left at 0.
    condition = Declared(
        Gauge,
        "pdmtp_condition",
        "1 for each condition a PDDeployment's status holds, with its status and reason.",
        CONDITION_LABELS,
    )
    verdict = Declared(
        Gauge,
        "pdmtp_revision_verdict",
        "1 for each revision's current verdict on its P/D path, with its reason "
        "(status.revisions[].verification).",
        (*LABELS, "revision", "verdict", "reason"),
    )
    acceptance = Declared(
        Gauge,
        "pdmtp_revision_acceptance_length",
        "Accepted MTP tokens per draft over a revision's decodes' lifetime.",
        (*LABELS, "revision"),
    )
    probes = Declared(
        Counter,
        "pdmtp_verification_probes_total",
        "Requests the operator sent through a revision's router so that its verdict could"
        " be reached without traffic, by result: ok, failed, or recorded (a test's probe"
        " target, nothing dialled).",
        (*LABELS, "result"),
    )
    rollbacks = Declared(
        Counter,
        "pdmtp_rollbacks_total",
        f"Rollbacks started (the {reasons.ROLLBACK_STARTED} event): a new revision failed"
        " and the old one is scaled back.",
        LABELS,
    )

    autoscaler_desired = Declared(
        Gauge,
        "pdmtp_autoscaler_desired_replicas",
        "The count the autoscaler rolls an engine role to (spec.autoscaling).",
        (*LABELS, "role"),
    )
    autoscaler_recommended = Declared(
        Gauge,
        "pdmtp_autoscaler_recommended_replicas",
        "The autoscaler's raw recommendation, before stabilisation, step limits, min/max and"
        " the ratio band.",
        (*LABELS, "role"),
    )
    autoscaler_signal = Declared(
        Gauge,
        "pdmtp_autoscaler_signal_value",
        "A signal as the last evaluation read it (absent while missing).",
        (*LABELS, "role", "signal"),
    )
    autoscaler_coverage = Declared(
        Gauge,
        "pdmtp_autoscaler_signal_coverage",
        "1 for each signal's coverage at the last evaluation: full, partial (some Ready pods"
        " did not report), missing (none did) or quiet (nothing to measure).",
        COVERAGE_LABELS,
    )
    autoscaler_decisions = Declared(
        Counter,
        "pdmtp_autoscaler_decisions_total",
        "Decisions that changed a role's desired count, by direction (up or down).",
        (*LABELS, "role", "direction"),
    )

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        for attr, declared in vars(Metrics).items():
            if isinstance(declared, Declared):
                self.__dict__[attr] = declared.create(self.registry)
        self.build_info.labels(__version__).set(1)
        self._current: dict[tuple[str, str], dict[Gauge, set[tuple[str, ...]]]] = {}
        """Per PDDeployment, the label values of the one-per-state series set last time (the
        conditions, the signals' coverage): what the next observation removes if it is gone."""

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format (`pdmtp.endpoints` serves it)."""
        return generate_latest(self.registry)

    def observe(
        self,
        namespace: str,
        name: str,
        decision: Decision,
        report: Report,
        unapplied: Sequence[str],
        seconds: float,
    ) -> None:
        """`unapplied`: the keys of the actions refused or never sent."""
        self.reconciles.labels(namespace, name).inc()
        # Counters exist at 0 from the first reconcile, so the first error, refusal or rollback
        # is an increase a rate() sees.
        for counter in (self.reconcile_errors, self.refused, self.rollbacks):
            counter.labels(namespace, name)
        self.duration.observe(seconds)
        for action in decision.actions:
            if action.key not in unapplied:
                self.writes.labels(namespace, name, type(action).__name__.lower()).inc()
        agreement = decision.agreement
        if agreement is not None:
            self.compatible.labels(namespace, name).set(1 if agreement.compatible else 0)
            for finding in agreement.findings:
                self.validation_failures.labels(namespace, name, finding.reason).inc()
        status = report.status
        roles = {r.name: r for r in status.roles}
        self.revisions.labels(namespace, name).set(len(status.revisions))
        desired = sum(roles[r].desired_replicas for r in v.ENGINE_ROLES if r in roles)
        updated = sum(roles[r].updated_replicas for r in v.ENGINE_ROLES if r in roles)
        self.progress.labels(namespace, name).set(min(1.0, updated / desired) if desired else 0)
        for role, counts in roles.items():
            self.ready.labels(namespace, name, role).set(counts.ready_replicas)
            self.desired.labels(namespace, name, role).set(counts.desired_replicas)
        conditions: set[tuple[str, ...]] = {
            (namespace, name, c.type, c.status, c.reason) for c in status.conditions
        }
        self._set_current(namespace, name, self.condition, conditions)
        self._verdicts(namespace, name, report)
        for event in report.events:
            if event.reason == reasons.ROLLBACK_STARTED:
                self.rollbacks.labels(namespace, name).inc()
        self._autoscaling(namespace, name, report)

    def _set_current(
        self,
        namespace: str,
        name: str,
        gauge: Gauge,
        current: set[tuple[str, ...]] | Mapping[tuple[str, ...], float],
    ) -> None:
        """Set `current` series of `gauge` (to their values, or to 1 for a set) and remove
        those of the last call not in it."""
        values = current if isinstance(current, Mapping) else dict.fromkeys(current, 1.0)
        last = self._current.setdefault((namespace, name), {})
        for gone in last.get(gauge, set()) - values.keys():
            gauge.remove(*gone)
        for labels, value in values.items():
            gauge.labels(*labels).set(value)
        last[gauge] = set(values)

    def _verdicts(self, namespace: str, name: str, report: Report) -> None:
        verdicts: set[tuple[str, ...]] = set()
        acceptance: dict[tuple[str, ...], float] = {}
        for revision in report.status.revisions:
            judged = revision.verification
            if judged is None:
                continue
            labels = (namespace, name, revision.revision)
            verdicts.add((*labels, judged.verdict, judged.reason))
            if judged.acceptance_length is not None:
                acceptance[labels] = judged.acceptance_length
        self._set_current(namespace, name, self.verdict, verdicts)
        self._set_current(namespace, name, self.acceptance, acceptance)

    def _autoscaling(self, namespace: str, name: str, report: Report) -> None:
        scaling = report.status.autoscaling
        coverage: set[tuple[str, ...]] = set()
        for role in scaling.roles if scaling is not None else ():
            labels = (namespace, name, role.name)
            for direction in DIRECTIONS:  # at 0 from the first evaluation: rate() sees the first
                self.autoscaler_decisions.labels(*labels, direction)
            self.autoscaler_desired.labels(*labels).set(role.desired_replicas)
            if role.recommendation is not None:
                self.autoscaler_recommended.labels(*labels).set(role.recommendation)
            for signal in role.signals:
                gauge = self.autoscaler_signal.labels(*labels, signal.signal)
                gauge.set(signal.value if signal.value is not None else float("nan"))
                coverage.add((*labels, signal.signal, signal.coverage))
        self._set_current(namespace, name, self.autoscaler_coverage, coverage)
        for event in report.events:
            if event.reason in (reasons.AUTOSCALED_UP, reasons.AUTOSCALED_DOWN):
                scaled = event.message.split(" ", 1)[0]
                direction = (
                    DIRECTIONS[0] if event.reason == reasons.AUTOSCALED_UP else DIRECTIONS[1]
                )
                self.autoscaler_decisions.labels(namespace, name, scaled, direction).inc()

    def forget(self, namespace: str, name: str) -> None:
        """Drop a deleted PDDeployment's series."""
        for metric in (
            self.compatible,
            self.revisions,
            self.progress,
            self.reconcile_errors,
            self.refused,
            self.rollbacks,
        ):
            with contextlib.suppress(KeyError):
                metric.remove(namespace, name)
        for role in v.ROLES:
            for gauge in (
                self.ready,
                self.desired,
                self.autoscaler_desired,
                self.autoscaler_recommended,
            ):
                with contextlib.suppress(KeyError):
                    gauge.remove(namespace, name, role)
            for direction in DIRECTIONS:
                with contextlib.suppress(KeyError):
                    self.autoscaler_decisions.remove(namespace, name, role, direction)
        for result in PROBE_RESULTS:
            with contextlib.suppress(KeyError):
                self.probes.remove(namespace, name, result)
        for gauge, series in self._current.pop((namespace, name), {}).items():
            for labels in series:
                gauge.remove(*labels)

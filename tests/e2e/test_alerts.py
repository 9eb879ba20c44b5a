"""kind e2e: the chart's alerts fire in the scenario that should fire them, and every metric a
rule or a dashboard panel uses is really scraped (issue 32).

Prometheus runs on the host (promkit.py): the chart's rules with `for` shortened to seconds, the
operator and the emulated engines scraped through the API server as the chart's monitors would
label them. One namespace of PDDeployments, each broken in one way, plus two namespaces whose
ResourceQuota refuses something; they break side by side, so the module's kind time is about the
slowest alert's:

  steady      serves, then paused mid-change            PDMTPRolloutHeld
  crash       serves, then a decode that exits 1         PDMTPEngineFailing
  back        serves, then a new revision (k 3 -> 2)     PDMTPRolledBack
              whose decode exits 1
  mismatch    prefill and decode lookaheads differ       PDMTPConfigIncompatible (LookaheadMismatch)
  band        a P:D band no pair within min/max fits     PDMTPConfigIncompatible (InvalidSpec)
              (the CRD's CEL checks only the interval)
  nowhere     its pods fit no node, deadline 10 s         PDMTPNotServing, PDMTPRoleBelowDesired,
                                                         PDMTPRolloutStuck
  blind       decode autoscaled, its metrics served on   PDMTPAutoscalerMissingMetrics
              a port the operator does not scrape
  floor       serves 1P/1D under a 3-pod quota, then     PDMTPBelowMinimumAvailable
              asked for a second decode
  refused     its Service refused by a quota             PDMTPChildWritesRefused
  unverified  its decode lacks the fixed connector        PDMTPHandoffUnverified
              (exports no hand-off counts)               (HandoffNotReported)
  lossy       its decode fails every KV pull, under      PDMTPKVLoadsFailRequests
              loadFailurePolicy fail (vLLM's default):   (KVLoadFailed)
              the operator's own probes are the traffic

Before any is broken, the serving ones fire nothing. Not provoked here (see the module's
NOT_PROVOKED): the operator-level alerts need the operator itself broken.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from builders import pdd
from e2e.conftest import new_namespace
from e2e.kindkit import Kind, patch_pdd, wait_for
from e2e.promkit import (
    INTERVAL_SECONDS,
    Prometheus,
    api_access,
    monitors,
    prometheus_binary,
    scrape_config,
    shortened_rules,
    start_relay,
    without_grafana_variables,
)
from monitoring import dashboard, dashboard_expressions, rule_expressions
from monitoring import rules as monitoring_rules

NOT_PROVOKED = {
    "PDMTPReconcileErrors": "needs reconciles that fail other than by a refused write",
    "PDMTPWritesFenced": "needs a leader whose Lease renewals are late (a frozen API server)",
    "PDMTPWriteConflicts": "needs another writer fighting over the children for minutes",
    "PDMTPOperatorDown": "needs the operator gone (test_operator_failover's ground)",
    "PDMTPNoLeader": "needs every operator replica standing by",
}
"""Alerts of the chart this module does not provoke, and why."""
FIRE_TIMEOUT = 240
"""Seconds an alert may take from its provocation (rollbacks wait for a crash loop)."""


@dataclass
class Alerting:
    prometheus: Prometheus
    namespace: str
    quota_namespace: str
    refused_namespace: str
    rules: dict[str, Any]
    fired: dict[str, float] = field(default_factory=dict)

    def wait_firing(self, alert: str, since: float, **labels: str) -> None:
        """Wait for `alert` with `labels` to fire; record the seconds since `since`."""
        wait_for(
            lambda: self.prometheus.firing_for(alert, **labels),
            f"{alert} {labels} firing",
            FIRE_TIMEOUT,
            every=1.0,
        )
        self.fired[alert] = round(time.monotonic() - since, 1)
        print(f"\n{alert} {labels}: firing after {self.fired[alert]} s")

    def assert_quiet(self, namespace: str, name: str) -> None:
        firing = [
            a
            for a in self.prometheus.firing()
            if a.get("namespace") == namespace and a.get("name") == name
        ]
        assert not firing, f"{namespace}/{name} fires before it is broken: {firing}"


def spec(kind: Kind, name: str) -> Any:
    """A small emulated PDDeployment, 1P/1D, light on the kind node's two cores."""
    return (
        pdd(name)
        .set(image=kind.images.emulator, model={"name": kind.images.engine_model})
        .mtp(3, modules=3, method="deepseek_mtp")
        .prefill(replicas=1)
        .decode(replicas=1)
        .router(image=kind.images.router, resources={"requests": {"cpu": "50m"}})
        .rollout(maxSurge=1, maxUnavailable=0, drainSeconds=1, progressDeadlineSeconds=60)
        .set(pod={"terminationGracePeriodSeconds": 5})
    )


def quota(name: str, hard: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name},
        "spec": {"hard": hard},
    }


@pytest.fixture(scope="module")
def alerting(
    kind: Kind, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Alerting]:
    try:
        binary = prometheus_binary()
        helm = Path(os.environ["PDMTP_HELM"])
    except (LookupError, KeyError) as exc:
        pytest.fail(f"prometheus or helm missing: {exc}")
    quota_namespace = new_namespace(kind, "alerts-quota")
    refused_namespace = new_namespace(kind, "alerts-refused")
    directory = tmp_path_factory.mktemp("prometheus")
    api = api_access(kind.kubeconfig, directory / "tls")
    start_relay(kind, namespace)
    config = scrape_config(monitors(helm), api, [namespace, quota_namespace, refused_namespace])
    rules = monitoring_rules()
    prometheus = Prometheus.start(binary, directory, config, shortened_rules(rules))
    try:
        yield Alerting(prometheus, namespace, quota_namespace, refused_namespace, rules)
    finally:
        print(f"\nprometheus log (tail):\n{prometheus.log_tail()}")
        prometheus.stop()
        for extra in (quota_namespace, refused_namespace):
            kind.kubectl("delete", "namespace", extra, "--wait=false", check=False)


def test_alerts_fire_and_every_metric_they_use_is_scraped(kind: Kind, alerting: Alerting) -> None:
    """One scenario: the alerts' provocations also make the series the name check reads."""
    each_alert_fires_in_its_scenario(kind, alerting)
    every_metric_a_rule_or_panel_uses_is_scraped(alerting)


def each_alert_fires_in_its_scenario(kind: Kind, alerting: Alerting) -> None:
    ns, quota_ns = alerting.namespace, alerting.quota_namespace
    prom = alerting.prometheus

    # The ones that must serve first, and a quota that lets exactly their three pods run.
    kind.apply(quota("pods", {"pods": "3"}), quota_ns)
    for name in ("steady", "crash", "back"):
        kind.apply(spec(kind, name).dict(), ns)
    kind.apply(spec(kind, "floor").dict(), quota_ns)
    serving = [(ns, "steady"), (ns, "crash"), (ns, "back"), (quota_ns, "floor")]
    for namespace, name in serving:
        wait_for(lambda n=namespace, m=name: kind.settled(n, m), f"{namespace}/{name} serving", 240)
    # Their start (nothing Ready yet) may have fired something with the seconds-long `for`s;
    # settled, nothing may fire once an evaluation has seen them whole.
    for namespace, name in serving:
        wait_for(
            lambda n=namespace, m=name: (
                not [a for a in prom.firing() if a.get("namespace") == n and a.get("name") == m]
            ),
            f"{namespace}/{name} quiet",
            60,
        )
    prom.wait_evaluated(seconds=3 * INTERVAL_SECONDS)  # a pending alert would fire by then
    for namespace, name in serving:
        alerting.assert_quiet(namespace, name)
    assert not prom.firing_for("PDMTPOperatorDown") and not prom.firing_for("PDMTPNoLeader")

    start = time.monotonic()
    # steady: paused with a change pending.
    patch_pdd(
        kind,
        ns,
        "steady",
        {
            "spec": {
                "rollout": {"paused": True},
                "decode": {"env": [{"name": "PDMTP_EMULATOR_STEP_SECONDS", "value": "0.004"}]},
            }
        },
    )
    # crash: a decode the emulator refuses to start (exit 1, its message in the termination
    # log). An env change stays in the serving revision: nothing to roll back to, it crash-loops.
    crash_env = [{"name": "PDMTP_EMULATOR_MAX_RUNNING", "value": "none"}]
    patch_pdd(kind, ns, "crash", {"spec": {"decode": {"env": crash_env}}})
    # back: the same decode in a new revision (k 3 -> 2): it crash-loops and the rollout rolls
    # back to k=3 (Degraded's reason is then RolledBack, not the engine's).
    patch_pdd(
        kind,
        ns,
        "back",
        {"spec": {"speculative": {"numSpeculativeTokens": 2}, "decode": {"env": crash_env}}},
    )
    # mismatch: the decode drafts 2 tokens where the prefill drafts 3.
    kind.apply(spec(kind, "mismatch").decode(k=2).dict(), ns)
    # band: 1P-2P with 1D gives ratios 1 and 2, none inside [1.4, 1.6]. The CRD's CEL can only
    # check the real interval (it passes); the operator checks whole pairs and refuses the spec.
    band = {"min": 1.4, "max": 1.6}
    prefill_scaling = {
        "minReplicas": 1,
        "maxReplicas": 2,
        "targets": [{"signal": "runningRequestsPerPod", "value": 4}],
    }
    kind.apply(
        spec(kind, "band").set(autoscaling={"prefill": prefill_scaling, "ratio": band}).dict(), ns
    )
    # nowhere: no node has the label; the first rollout's deadline is the minimum.
    nowhere = {"nodeSelector": {"pdmtp.io/e2e-nowhere": "true"}}
    kind.apply(
        spec(kind, "nowhere")
        .prefill(**nowhere)
        .decode(**nowhere)
        .rollout(progressDeadlineSeconds=10)
        .dict(),
        ns,
    )
    # blind: the decode's emulator serves its metrics on another port than the one the operator
    # scrapes (the emulator's own knob: PDMTP_METRICS_PORT is the operator's, refused in a
    # role's env), so the autoscaler reads nothing from it.
    kind.apply(
        spec(kind, "blind")
        .decode(env=[{"name": "PDMTP_EMULATOR_METRICS_PORT", "value": "29199"}])
        .set(
            autoscaling={
                "decode": {
                    "minReplicas": 1,
                    "maxReplicas": 2,
                    "targets": [{"signal": "runningRequestsPerPod", "value": 4}],
                },
                "intervalSeconds": 5,
                "staleAfterSeconds": 15,
            }
        )
        .dict(),
        ns,
    )
    # unverified: the decode's engine lacks the fixed connector (it exports no hand-off counts),
    # so its verdict fails on the first scrape: no traffic needed.
    kind.apply(
        spec(kind, "unverified")
        .decode(env=[{"name": "PDMTP_EMULATOR_FIXED_CONNECTOR", "value": "0"}])
        .dict(),
        ns,
    )
    # lossy: every KV pull of its decode fails and, under the default loadFailurePolicy (fail),
    # fails its request. No client sends anything: the operator's probes (a verdict awaiting
    # requests) are the failed requests. Replacing the failing decode is off, so the one pod's
    # counts keep the verdict where it is.
    kind.apply(
        spec(kind, "lossy")
        .decode(env=[{"name": "PDMTP_EMULATOR_PULL_FAILURE_RATE", "value": "1"}])
        .set(verification={"replaceAfterFailedPulls": 0})
        .dict(),
        ns,
    )
    # floor: a second decode that the quota refuses.
    patch_pdd(kind, quota_ns, "floor", {"spec": {"decode": {"replicas": 2}}})
    # refused: the quota refuses the client Service.
    kind.apply(quota("services", {"services": "0"}), alerting.refused_namespace)
    kind.apply(spec(kind, "refused").dict(), alerting.refused_namespace)

    alerting.wait_firing("PDMTPRolloutHeld", start, namespace=ns, name="steady", reason="Paused")
    alerting.wait_firing(
        "PDMTPConfigIncompatible", start, namespace=ns, name="mismatch", reason="LookaheadMismatch"
    )
    alerting.wait_firing(
        "PDMTPConfigIncompatible", start, namespace=ns, name="band", reason="InvalidSpec"
    )
    alerting.wait_firing("PDMTPNotServing", start, namespace=ns, name="nowhere")
    alerting.wait_firing("PDMTPRoleBelowDesired", start, namespace=ns, name="nowhere")
    alerting.wait_firing("PDMTPRolloutStuck", start, namespace=ns, name="nowhere")
    alerting.wait_firing("PDMTPBelowMinimumAvailable", start, namespace=quota_ns, name="floor")
    alerting.wait_firing(
        "PDMTPChildWritesRefused", start, namespace=alerting.refused_namespace, name="refused"
    )
    alerting.wait_firing("PDMTPAutoscalerMissingMetrics", start, namespace=ns, name="blind")
    alerting.wait_firing("PDMTPEngineFailing", start, namespace=ns, name="crash")
    alerting.wait_firing("PDMTPRolledBack", start, namespace=ns, name="back")
    alerting.wait_firing(
        "PDMTPHandoffUnverified",
        start,
        namespace=ns,
        name="unverified",
        reason="HandoffNotReported",
    )
    alerting.wait_firing("PDMTPKVLoadsFailRequests", start, namespace=ns, name="lossy")

    every = {str(r["alert"]) for g in alerting.rules["groups"] for r in g["rules"] if "alert" in r}
    table = "\n".join(
        f"  {alert:40} {alerting.fired[alert]:>6} s"
        if alert in alerting.fired
        else f"  {alert:40} not provoked: {NOT_PROVOKED.get(alert, '?')}"
        for alert in sorted(every)
    )
    print(f"\nalert -> fired after (s, from the provocations)\n{table}")
    assert every <= set(alerting.fired) | set(NOT_PROVOKED), (
        every - set(alerting.fired) - set(NOT_PROVOKED)
    )


def every_metric_a_rule_or_panel_uses_is_scraped(alerting: Alerting) -> None:
    prom = alerting.prometheus
    expressions = {f"rule {k}": v for k, v in rule_expressions(alerting.rules).items()}
    expressions |= {
        k: without_grafana_variables(v) for k, v in dashboard_expressions(dashboard()).items()
    }
    used: dict[str, set[str]] = {}
    for where, expr in expressions.items():
        for name in prom.parsed_names(expr):
            used.setdefault(name, set()).add(where)
    assert used, "no metric name found in the rules"
    scraped = prom.metric_names()
    missing = {name: sorted(where) for name, where in used.items() if name not in scraped}
    print(
        f"\nmetric names used: {len(used)} ({len(expressions)} expressions); scraped: "
        f"{len(scraped)}; used and not scraped: {len(missing)}"
    )
    assert not missing, json.dumps(missing, indent=2)

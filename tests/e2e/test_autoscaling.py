"""kind e2e: the operator's own autoscaler (spec.autoscaling, issue 22), the operator in-cluster
scraping emulated engines behind the real router, under the in-cluster load client:

1. a load step (2 -> 12 closed-loop clients) scales prefill and decode up to their max, every
   decision the status shows inside the prefill:decode band, the new pods Ready; the steady load
   makes no further decision; the load dropping back scales both down to 1P/1D; no request fails
   or crosses revisions over the whole episode;
2. MTP-aware: at the same load, the decode engines' draft acceptance is lowered through the
   emulator's admin endpoint (`POST /emulator/config` on the engine port, sent from inside each
   decode pod by `kubectl exec`, new decode pods included): status.autoscaling's acceptanceLength
   drops and decode scales up on decodeTokensPerSecondPerPod; no request fails.

The emulator's knobs (role env) make wall time, not the node's 2 busy cores, set the pace: a
prompt takes 0.6 s and a decode step 0.05 s, so a client sends about one request per 0.75 s
(12 clients ~16/s at most) and the acceptance hardly changes that. The signals are those that
follow such load in proportion: served decode tokens per second (a counter rate over the
interval, smooth) and, for the prefill, running (Little's law) and waiting prompts per pod
(gauges read once per interval, noisy: the stabilisation windows absorb that, and the load is
sized so the steady states sit well inside their hysteresis: one pod at base, maxReplicas at the
peak). Figures go to PDMTP_E2E_AUTOSCALING_RESULT (JSON) when set, and are printed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from builders import pdd
from e2e.kindkit import Kind, KubectlError, LoadRun, wait_for
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from pdmtp.api.vocabulary import ANNOTATION_LEAVING, GROUP, LABEL_NAME, LABEL_ROLE, VERSION

NAME = "elastic"
RESULT_ENV = "PDMTP_E2E_AUTOSCALING_RESULT"
INTERVAL = 3
BAND = (0.5, 2.0)
MAX = {"prefill": 2, "decode": 3}
K = 3
ACCEPTANCE_RATE = 0.7
"""The emulator's default: 0.7 of the K draft tokens accepted."""
EXPECTED_ACCEPTANCE = round(K * ACCEPTANCE_RATE, 3)
"""Accepted tokens per draft at that rate (2.1): the decode's expectedAcceptanceLength."""
LOW_ACCEPTANCE_RATE = 0.1
BASE_CLIENTS, BURST_CLIENTS = 2, 10
STEADY_SECONDS = 45
"""The window at the peak load in which decisions are counted (none expected)."""
DECISIONS, PROBES = "pdmtp_autoscaler_decisions_total", "pdmtp_verification_probes_total"
TUNING = {
    # 0.6 s per prompt, eight at once: one pod serves ~13 prompts/s, more wait.
    "prefill": {"MAX_RUNNING": "8", "PREFILL_SECONDS": "0.6"},
    # Room for every client; 0.05 s a step: 2 steps a request at 2.1 accepted tokens per draft,
    # 4 at 0.3. The prefill's 0.6 s sets the pace either way: "the same load" stays about the
    # same request rate when the acceptance drops.
    "decode": {"MAX_RUNNING": "16", "STEP_SECONDS": "0.05"},
}
BEHAVIOR = {
    # Two evaluations in a row must agree before a pod is bought; +2 pods per 15 s.
    "scaleUp": {"stabilizationWindowSeconds": 6, "periodSeconds": 15, "maxPods": 2},
    # Four before one is given back (a running gauge sampled once per interval is noisy).
    "scaleDown": {"stabilizationWindowSeconds": 12, "periodSeconds": 15, "maxPods": 2},
}
TARGETS = {
    # Little's law: running prompts per pod = requests/s x 0.6 s / pods. 2 clients keep ~1.5
    # running (at most 2), 12 about 8 and some waiting: one pod, then the max.
    "prefill": [
        {"signal": "waitingRequestsPerPod", "value": 2},
        {"signal": "runningRequestsPerPod", "value": 2},
    ],
    # A request is 3.1 decode tokens at 2.1 accepted per draft (3.9 at 0.3). 2 clients make at
    # most ~8.5 tokens/s: one pod, at <= 0.85 of the target; 12 make 35-50: the max, at > 1 of it
    # per pod (a scale-down needs 2/3). At acceptance 0.1 the target shrinks by (1 + 0.3) /
    # (1 + 2.1) and the same requests make a few more tokens: about 2 pods' worth.
    "decode": [{"signal": "decodeTokensPerSecondPerPod", "value": 10}],
}
results: dict[str, Any] = {}


def spec_for(kind: Kind) -> dict[str, Any]:
    def role(name: str) -> dict[str, Any]:
        scaling: dict[str, Any] = {
            "minReplicas": 1,
            "maxReplicas": MAX[name],
            "targets": TARGETS[name],
            "behavior": BEHAVIOR,
        }
        if name == "decode":
            scaling["expectedAcceptanceLength"] = EXPECTED_ACCEPTANCE
        return scaling

    def env(name: str) -> list[dict[str, str]]:
        return [{"name": f"PDMTP_EMULATOR_{k}", "value": v} for k, v in TUNING[name].items()]

    return (
        pdd(NAME)
        .set(image=kind.images.emulator, model={"name": kind.images.engine_model})
        .mtp(K, modules=K, method="deepseek_mtp")
        .prefill(replicas=1, env=env("prefill"))
        .decode(replicas=1, env=env("decode"))
        .router(image=kind.images.router, resources={"requests": {"cpu": "100m"}})
        .rollout(maxSurge=1, maxUnavailable=0, drainSeconds=3)
        # Emulated engines stop at once: 3 s of serving after they are told to stop.
        .set(pod={"terminationGracePeriodSeconds": 33})
        # The verdict's probes (one every 5 s while the revision has fewer than 8 pulled
        # requests) are load too: at this scale one adds 60 % to the decode tokens of the 3 s
        # window it lands in (runs 5 and 12: 13 drafts and 28 accepted tokens, the base load's
        # 8 and 17 plus one probe's), and two windows in a row scale decode up at the base load
        # (the CI of 2026-12-07). The load here is the clients' alone.
        .set(verification={"probeRequestsPerMinute": 0})
        .set(
            autoscaling={
                "prefill": role("prefill"),
                "decode": role("decode"),
                "ratio": {"min": BAND[0], "max": BAND[1]},
                "intervalSeconds": INTERVAL,
                "staleAfterSeconds": 5 * INTERVAL,
            }
        )
        .dict()
    )


def record(key: str, figures: dict[str, Any]) -> None:
    results[key] = figures
    print(f"\n{key}: {json.dumps(figures, sort_keys=True)}")
    if os.environ.get(RESULT_ENV):
        Path(os.environ[RESULT_ENV]).write_text(json.dumps(results, indent=2, sort_keys=True))


def epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def usable(pod: dict[str, Any]) -> bool:
    meta = pod["metadata"]
    return not meta.get("deletionTimestamp") and ANNOTATION_LEAVING not in (
        meta.get("annotations") or {}
    )


def ready(pod: dict[str, Any]) -> bool:
    conditions = pod["status"].get("conditions", [])
    return usable(pod) and any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def role_of(scaling: dict[str, Any], role: str) -> dict[str, Any]:
    return next((r for r in scaling.get("roles", []) if r["name"] == role), {})


@dataclass(frozen=True)
class Sample:
    """One look at the PDDeployment and its engine pods."""

    at: float
    """Unix time."""
    desired: dict[str, int]
    ready: dict[str, int]
    """Ready engine pods per role, none leaving or terminating."""
    pods: dict[str, int]
    """Engine pods per role, whatever their state."""
    evaluated: str
    roles: dict[str, dict[str, Any]]
    verdicts: tuple[str, ...] = ()
    """Each revision's verdict and its reason (a verdict awaiting requests draws probes)."""


@dataclass
class Watch:
    """Samples the PDDeployment's autoscaling status and its engine pods about once a second
    in a thread, so every decision the status shows is seen and checked against the band."""

    kind: Kind
    namespace: str
    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _api: client.ApiClient | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Watch:
        # The API client, not kubectl: a look a second costs no process on the 2 busy cores.
        self._api = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kind.kubeconfig)
        )
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        if self._api is not None:
            self._api.close()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self.samples.append(self.look())
            except (ApiException, OSError, KeyError, ValueError) as exc:
                self.errors.append(str(exc)[:300])

    def look(self) -> Sample:
        obj = client.CustomObjectsApi(self._api).get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "pddeployments", NAME, _request_timeout=10
        )
        # Raw JSON: the same dicts kubectl gives, without building the client's models.
        answer = client.CoreV1Api(self._api).list_namespaced_pod(
            self.namespace,
            label_selector=f"{LABEL_NAME}={NAME}",
            _preload_content=False,
            _request_timeout=10,
        )
        pods = json.loads(answer.data)["items"]
        scaling = obj.get("status", {}).get("autoscaling") or {}
        roles = {role: role_of(scaling, role) for role in ("prefill", "decode")}
        counts: dict[str, dict[str, int]] = {"ready": {}, "pods": {}}
        for role in roles:
            mine = [p for p in pods if p["metadata"]["labels"].get(LABEL_ROLE) == role]
            counts["ready"][role] = sum(1 for p in mine if ready(p))
            counts["pods"][role] = len(mine)
        return Sample(
            at=time.time(),
            desired={role: r.get("desiredReplicas", 0) for role, r in roles.items()},
            ready=counts["ready"],
            pods=counts["pods"],
            evaluated=scaling.get("lastEvaluationTime", ""),
            roles=roles,
            verdicts=tuple(
                f"{r.get('revision')} {(r.get('verification') or {}).get('verdict')}"
                f" {(r.get('verification') or {}).get('reason')}"
                for r in obj.get("status", {}).get("revisions") or []
            ),
        )

    def latest(self) -> Sample:
        wait_for(lambda: self.samples, "a first look", 30, every=0.2)
        return self.samples[-1]

    def until(self, check: Callable[[Sample], bool], what: str, timeout: float) -> Sample:
        def probe() -> Sample | None:
            sample = self.latest()
            return sample if check(sample) else None

        try:
            return wait_for(probe, what, timeout, every=0.5)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; last: {self.describe(self.latest())}") from exc

    def since(self, at: float) -> list[Sample]:
        return [s for s in self.samples if s.at >= at]

    def decisions(self, since: float = 0.0) -> list[tuple[float, dict[str, int]]]:
        """Each change of the desired pair the watch saw, with its time."""
        out: list[tuple[float, dict[str, int]]] = []
        last: dict[str, int] | None = None
        for sample in self.samples:
            if 0 in sample.desired.values():
                continue
            if sample.desired != last:
                if last is not None and sample.at >= since:
                    out.append((sample.at, sample.desired))
                last = sample.desired
        return out

    def first(self, check: Callable[[Sample], bool], since: float) -> Sample | None:
        return next((s for s in self.since(since) if check(s)), None)

    def pairs(self) -> list[tuple[int, int]]:
        """Every (prefill, decode) desired pair the status showed, in the order first seen."""
        seen = (
            (s.desired["prefill"], s.desired["decode"])
            for s in self.samples
            if 0 not in s.desired.values()
        )
        return list(dict.fromkeys(seen))

    def outside_band(self) -> list[tuple[int, int]]:
        return [(p, d) for p, d in self.pairs() if not BAND[0] <= p / d <= BAND[1]]

    @staticmethod
    def describe(sample: Sample) -> str:
        parts = []
        for role, r in sample.roles.items():
            signals = {s["signal"]: (s.get("value"), s["target"]) for s in r.get("signals", [])}
            parts.append(
                f"{role}: desired {sample.desired[role]}, ready {sample.ready[role]}/"
                f"{sample.pods[role]} pods, acceptance {r.get('acceptanceLength')}, "
                f"{r.get('reason')!r}, signals {signals}"
            )
        return "; ".join(parts) + f"; verdicts {list(sample.verdicts)}"


def operator_counter(kind: Kind, namespace: str, metric: str) -> float:
    """A counter of this PDDeployment (summed over its other labels), from the leading
    operator's metrics through the API server."""
    text = kind.operator_metrics()
    total = 0.0
    for line in text.splitlines():
        if (
            line.startswith(metric + "{")
            and f'namespace="{namespace}"' in line
            and f'name="{NAME}"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def load_started(kind: Kind, namespace: str, run: LoadRun) -> float:
    """When the load client's container started (Unix time): the load step."""
    pod = kind.get("pod", "-n", namespace, run.name)
    return epoch(pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"])


def request_rate(runs: list[LoadRun], seconds: float) -> float:
    """Requests per second the load clients send over the next `seconds` (read off their
    progress lines, written every 2 s)."""
    first = [run.progress() or {} for run in runs]
    time.sleep(seconds)
    rate = 0.0
    for run, then in zip(runs, first, strict=True):
        now = run.progress() or {}
        elapsed = now.get("seconds", 0) - then.get("seconds", 0)
        if elapsed > 0:
            rate += (now["sent"] - then.get("sent", 0)) / elapsed
    return round(rate, 2)


def autoscaled_events(kind: Kind, namespace: str) -> dict[str, int]:
    """The PDDeployment's AutoscaledUp and AutoscaledDown events (one per role and decision)."""
    selector = f"involvedObject.name={NAME}"
    events = kind.get("events", "-n", namespace, "--field-selector", selector)["items"]
    counts = {"AutoscaledUp": 0, "AutoscaledDown": 0}
    for event in events:
        if event.get("reason") in counts:
            counts[event["reason"]] += event.get("count") or 1
    return counts


@dataclass
class Acceptance:
    """Keeps every decode pod's emulated MTP acceptance at `rate` (a new decode pod starts at
    the env's default), through `POST /emulator/config` on its engine port, sent from inside
    the pod by `kubectl exec`: nothing dials a pod from the host."""

    kind: Kind
    namespace: str
    rate: float
    configured: dict[str, float] = field(default_factory=dict)
    """Pod -> when (Unix time) its engine took the new rate."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def post(self, pod: str) -> dict[str, Any]:
        script = (
            "import sys, urllib.request\n"
            "request = urllib.request.Request('http://127.0.0.1:8000/emulator/config',"
            " data=sys.argv[1].encode(), headers={'Content-Type': 'application/json'})\n"
            "print(urllib.request.urlopen(request, timeout=5).read().decode())\n"
        )
        body = json.dumps({"acceptance_rate": self.rate})
        out = self.kind.kubectl(
            "-n", self.namespace, "exec", pod, "-c", "engine", "--",
            "python", "-c", script, body,
            timeout=30,
        )  # fmt: skip
        answer: dict[str, Any] = json.loads(out)
        return answer

    def sweep(self) -> bool:
        """Tell every decode pod whose engine is up and not told yet; True when none is left."""
        left = False
        for pod in self.kind.pods(self.namespace, f"{LABEL_NAME}={NAME},{LABEL_ROLE}=decode"):
            name = pod["metadata"]["name"]
            started = any(
                "running" in (c.get("state") or {})
                for c in pod["status"].get("containerStatuses", [])
            )
            if name in self.configured or not usable(pod):
                continue
            try:
                answer = self.post(name) if started else {}
            except (KubectlError, ValueError):  # its engine is not listening yet
                answer = {}
            if answer.get("acceptance_rate") == self.rate:
                self.configured[name] = time.time()
            else:
                left = True  # the next sweep tries again
        return not left

    def __enter__(self) -> Acceptance:
        wait_for(self.sweep, "every decode pod told its new acceptance", 60)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self.sweep()
            except KubectlError:
                continue


@pytest.fixture(scope="module")
def revision(kind: Kind, namespace: str) -> str:
    kind.apply(spec_for(kind), namespace)
    kind.wait_condition(namespace, NAME, "Available", timeout=240)
    current: str = kind.pdd(namespace, NAME)["status"]["currentRevision"]
    return current


@pytest.fixture
def watch(kind: Kind, namespace: str, revision: str) -> Iterator[Watch]:
    with Watch(kind, namespace) as w:
        yield w
    assert not w.errors[5:], w.errors  # a few failed looks (API server busy) are tolerated


def seconds(sample: Sample | None, since: float) -> float | None:
    return None if sample is None else round(sample.at - since, 1)


def check_load(summary: dict[str, Any], revision: str) -> None:
    assert summary["stopped_by"] == "stop file", "the load ended before the episode did"
    assert summary["failed"] == 0, summary["errors"]
    assert summary["cross_revision"] == 0, summary["pairs"]
    assert set(summary["pairs"]) == {f"{revision}<-{revision} k={K}<-{K}"}, summary["pairs"]


def test_1_a_load_step_scales_both_roles_up_then_down_within_the_band(
    kind: Kind, namespace: str, revision: str, watch: Watch, loads: Callable[..., LoadRun]
) -> None:
    def settled(prefill: int, decode: int) -> Callable[[Sample], bool]:
        want = {"prefill": prefill, "decode": decode}
        return lambda s: s.desired == want and s.ready == want and s.pods == want

    watch.until(settled(1, 1), "1P/1D before the load", 60)
    base = loads(NAME, concurrency=BASE_CLIENTS, max_requests=20_000, max_seconds=400)
    base.wait_sending()
    # Two evaluations of the base load: it asks for nothing more.
    quiet_from = time.time()
    base_rate = request_rate([base], 2 * INTERVAL + 1)
    assert watch.latest().desired == {"prefill": 1, "decode": 1}, watch.describe(watch.latest())
    before = watch.latest()

    burst = loads(NAME, concurrency=BURST_CLIENTS, max_requests=20_000, max_seconds=300)
    burst.wait_sending()
    step = load_started(kind, namespace, burst)
    up = watch.until(
        lambda s: (
            all(s.desired[r] > 1 and s.ready[r] == s.desired[r] == s.pods[r] for r in MAX)
            # held for three evaluations: the top of the climb, not a stop on the way
            and all(x.desired == s.desired for x in watch.since(s.at - 3 * INTERVAL))
        ),
        "both roles scaled up and Ready",
        150,
    )
    peak = up.desired
    climb = {}
    for role in MAX:
        decided = watch.first(lambda s, r=role: s.desired[r] > 1, step)
        serving = watch.first(lambda s, r=role: s.ready[r] >= peak[r] == s.desired[r], step)
        assert decided is not None
        climb[role] = {
            "load_step_to_decided_seconds": seconds(decided, step),
            "load_step_to_ready_seconds": seconds(serving, step),
            "deciding_signal": decided.roles[role].get("decidingSignal"),
            "reason": decided.roles[role].get("reason"),
        }

    # Steady load: what the autoscaler does while nothing changes.
    steady_from, counted = time.time(), operator_counter(kind, namespace, DECISIONS)
    peak_rate = request_rate([base, burst], STEADY_SECONDS)
    steady_decisions = operator_counter(kind, namespace, DECISIONS) - counted
    steady_seconds = time.time() - steady_from
    steady_seen = watch.decisions(since=steady_from)
    at_peak = watch.latest()

    burst.stop()
    dropped = time.time()
    down = watch.until(settled(1, 1), "back to 1P/1D", 150)
    decided_down = watch.first(lambda s: s.desired == {"prefill": 1, "decode": 1}, dropped)
    base.stop()
    totals = [base.summary(), burst.summary()]
    events = autoscaled_events(kind, namespace)
    probes = operator_counter(kind, namespace, PROBES)

    record(
        "load step: scale up, steady, scale down",
        {
            "interval_seconds": INTERVAL,
            "clients": {"base": BASE_CLIENTS, "burst": BURST_CLIENTS},
            "requests_per_second": {"base": base_rate, "peak": peak_rate},
            "before": {"desired": before.desired, "signals": signals_of(before)},
            "verification_probes": probes,
            "peak": {"desired": peak, "signals": signals_of(at_peak)},
            "up": climb,
            "steady_window_seconds": round(steady_seconds, 1),
            "steady_decisions_metric": steady_decisions,
            "steady_decisions_per_minute": round(60 * steady_decisions / steady_seconds, 2),
            "steady_changes_seen": len(steady_seen),
            "load_drop_to_decided_down_seconds": seconds(decided_down, dropped),
            "load_drop_to_settled_seconds": seconds(down, dropped),
            "decisions_seen": [
                {"t": round(at - step, 1), **pair} for at, pair in watch.decisions(quiet_from)
            ],
            "events": events,
            "pairs_seen": watch.pairs(),
            "requests_sent": sum(t["sent"] for t in totals),
            "requests_failed": sum(t["failed"] for t in totals),
            "cross_revision": sum(t["cross_revision"] for t in totals),
            "errors": [e for t in totals for e in t["errors"]],
        },
    )
    for summary in totals:
        check_load(summary, revision)
    assert probes == 0, f"{probes} verification probes sent: they are load too"
    assert not watch.outside_band(), f"desired (prefill, decode) outside the band {BAND}"
    assert steady_decisions == 0 and not steady_seen, (
        f"{steady_decisions} decisions under steady load: {steady_seen}"
    )


def signals_of(sample: Sample) -> dict[str, Any]:
    return {
        role: {
            "acceptanceLength": r.get("acceptanceLength"),
            **{s["signal"]: [s.get("value"), s["target"]] for s in r.get("signals", [])},
        }
        for role, r in sample.roles.items()
    }


def test_2_lower_mtp_acceptance_at_the_same_load_scales_decode_up(
    kind: Kind, namespace: str, revision: str, watch: Watch, loads: Callable[..., LoadRun]
) -> None:
    watch.until(
        lambda s: s.desired == s.ready == s.pods == {"prefill": 1, "decode": 1},
        "1P/1D before the load",
        150,
    )
    run = loads(NAME, concurrency=BASE_CLIENTS, max_requests=20_000, max_seconds=300)
    run.wait_sending()

    def measured(s: Sample) -> bool:
        return s.roles["decode"].get("acceptanceLength") is not None

    # Two evaluations of the load at the expected acceptance: decode stays at one pod.
    first = watch.until(measured, "an acceptance measured", 60)
    watch.until(lambda s: s.evaluated not in ("", first.evaluated), "another evaluation", 30)
    rate_before = request_rate([run], 2 * INTERVAL)
    before = watch.latest()
    assert before.desired["decode"] == 1, watch.describe(before)
    measured_before = before.roles["decode"]["acceptanceLength"]
    assert abs(measured_before - EXPECTED_ACCEPTANCE) < 0.3, watch.describe(before)

    with Acceptance(kind, namespace, LOW_ACCEPTANCE_RATE) as lowered:
        changed = min(lowered.configured.values())
        up = watch.until(
            lambda s: s.desired["decode"] > 1 and s.ready["decode"] == s.desired["decode"],
            "decode scaled up on the lower acceptance",
            120,
        )
        decided = watch.first(lambda s: s.desired["decode"] > 1, changed)
        assert decided is not None
        rate_after = request_rate([run], 2 * INTERVAL)
        after = watch.latest()
        configured = sorted(lowered.configured)
    run.stop()
    summary = run.summary()
    record(
        "MTP acceptance lowered at the same load",
        {
            "acceptance_rate": [ACCEPTANCE_RATE, LOW_ACCEPTANCE_RATE],
            "requests_per_second": [rate_before, rate_after],
            "expected_acceptance_length": EXPECTED_ACCEPTANCE,
            "before": {"desired": before.desired, "signals": signals_of(before)},
            "after": {"desired": after.desired, "signals": signals_of(after)},
            "deciding_signal": decided.roles["decode"].get("decidingSignal"),
            "reason": decided.roles["decode"].get("reason"),
            "change_to_decided_seconds": seconds(decided, changed),
            "change_to_ready_seconds": seconds(up, changed),
            "decode_pods_configured": len(configured),
            "pairs_seen": watch.pairs(),
            "requests_sent": summary["sent"],
            "requests_failed": summary["failed"],
            "cross_revision": summary["cross_revision"],
        },
    )
    check_load(summary, revision)
    assert not watch.outside_band(), f"desired (prefill, decode) outside the band {BAND}"
    low = K * LOW_ACCEPTANCE_RATE
    assert abs(after.roles["decode"]["acceptanceLength"] - low) < 0.3, watch.describe(after)
    assert decided.roles["decode"].get("decidingSignal") == "decodeTokensPerSecondPerPod", (
        watch.describe(decided)
    )
    # Every decode pod serving at the end runs the lower acceptance.
    serving = {
        p["metadata"]["name"]
        for p in kind.pods(namespace, f"{LABEL_NAME}={NAME},{LABEL_ROLE}=decode")
        if ready(p)
    }
    assert serving <= set(configured), (serving, configured)

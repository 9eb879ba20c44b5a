"""Run `pdmtp run` as a real subprocess against the test cluster, and watch what it does.

`OperatorProcess` can be killed (SIGKILL, mid-roll) and started again. `RolloutWatcher` follows
every Pod and Deployment event of a namespace in a thread and checks the rollout invariants
(docs/design.md) at every observed moment with the core's checker; failures are collected and
asserted by the test.
"""

from __future__ import annotations

import atexit
import contextlib
import heapq
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from builders import PDDBuilder, unjudged
from cluster.kubehelpers import wait_for
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from loopback import free_ports
from pdmtp.api import vocabulary as v
from pdmtp.api.v1alpha1 import PDDeploymentSpec
from pdmtp.api.vocabulary import Role
from pdmtp.core import names
from pdmtp.core.agreement import check
from pdmtp.core.groups.grouping import groups_of, units, workloads
from pdmtp.core.objects import engine_url, is_terminating, labels_of, name_of, pod_ready
from pdmtp.core.render.membership import router_urls
from pdmtp.core.revision_state import RevisionState
from pdmtp.core.rollout.invariants import InvariantMonitor, Moment, Terminating, foreign_routes
from pdmtp.core.rollout.planner import Policy
from pdmtp.core.rollout.removal import listed_urls, removal_view
from pdmtp.core.rollout.states import revision_states
from pdmtp.core.rollout.steering import target_and_policy
from pdmtp.webhook import MANAGED_CONFIGURATION

CUSTOM = (v.GROUP, v.VERSION)


_RUNNING: set[subprocess.Popen[bytes]] = set()


@atexit.register
def _kill_leftovers() -> None:
    """Operators a test started and did not stop (a failed fixture, an interrupted run)."""
    for proc in _RUNNING:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


class OperatorProcess:
    """`pdmtp run` for one namespace, with its metrics and liveness on 127.0.0.1."""

    def __init__(
        self,
        kubeconfig: Path,
        namespaces: list[str],
        log_path: Path,
        resync_seconds: float = 2.0,
        extra_env: dict[str, str] | None = None,
        extra_args: list[str] | None = None,
        webhook: bool = False,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.namespaces = namespaces
        self.log_path = log_path
        self.resync_seconds = resync_seconds
        self.extra_env = extra_env or {}
        self.extra_args = extra_args or []
        # All at once: free ports picked one by one may repeat, and then the liveness probe
        # would be answered by the metrics server.
        self.metrics_port, self.liveness_port, self.webhook_port = free_ports(3)
        if webhook:
            self.extra_args += [
                "--webhook-listen",
                f"127.0.0.1:{self.webhook_port}",
                "--webhook-manage",
            ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        # KWOK's pod IPs are fake and never dialled: the autoscaler reads the metrics the test
        # writes here (`MetricsFiles`), <dir>/<namespace>/<pod>.prom.
        self.metrics_dir = log_path.parent / f"{log_path.stem}-metrics"
        self.metrics_dir.mkdir(parents=True, exist_ok=True)

    def start(self, timeout: float = 30, attempts: int = 3) -> None:
        """Start and wait until the liveness endpoint answers; a port taken meanwhile by
        another process (the race every free-port pick has) gets fresh ports and a retry."""
        for attempt in range(attempts):
            try:
                self._start_once(timeout)
                return
            except (RuntimeError, TimeoutError):
                self.kill()  # a half-started operator must not outlive the test
                if "address already in use" not in self.log_tail(40) or attempt == attempts - 1:
                    raise
                self._repick_ports()

    def _repick_ports(self) -> None:
        old = (self.metrics_port, self.liveness_port, self.webhook_port)
        self.metrics_port, self.liveness_port, self.webhook_port = free_ports(3)
        self.extra_args = [
            a.replace(f":{old[2]}", f":{self.webhook_port}") for a in self.extra_args
        ]

    def _start_once(self, timeout: float) -> None:
        args = [
            sys.executable,
            "-m",
            "pdmtp.cli",
            "run",
            "--kubeconfig",
            str(self.kubeconfig),
            "--resync-seconds",
            str(self.resync_seconds),
            "--metrics-port",
            str(self.metrics_port),
            "--metrics-address",
            "127.0.0.1",
            "--health-listen",
            f"127.0.0.1:{self.liveness_port}",
            "--metrics-source",
            f"dir:{self.metrics_dir}",
        ]
        for ns in self.namespaces:
            args += ["--namespace", ns]
        args += self.extra_args
        env = {**os.environ, **self.extra_env}
        log = self.log_path.open("ab")
        log.write(f"\n===== start #{self.starts + 1} =====\n".encode())
        log.flush()
        self.proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        _RUNNING.add(self.proc)
        self.starts += 1
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"operator exited {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=1
                ) as r:
                    # The operator answers JSON; anything else on this port is not it.
                    if r.status == 200 and r.headers.get_content_type() == "application/json":
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"operator not live after {timeout}s:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL: no cleanup, no goodbye, as a node loss would do it."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def restart(self, pause: tuple[float, float] = (0.5, 2.0)) -> None:
        """Killed (SIGKILL) and started again after a random pause in `pause` (seconds): what
        it then does, it decides from what it observes (invariant 6)."""
        self.kill()
        time.sleep(random.uniform(*pause))
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def health(self, path: str = "/readyz") -> tuple[int, dict[str, Any]]:
        """The status code and JSON body of `/healthz` or `/readyz`."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.liveness_port}{path}", timeout=5
            ) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def metrics(self) -> dict[str, float]:
        """Scrape the operator's metrics endpoint: `name{labels}` -> value."""
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5
        ) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def log_tail(self, lines: int = 80) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def delete_webhook_configuration(api: client.ApiClient) -> None:
    """Remove the ValidatingWebhookConfiguration a `--webhook-manage` operator kept (if any):
    it would point later tests' applies at a port nobody serves."""
    try:
        client.AdmissionregistrationV1Api(api).delete_validating_webhook_configuration(
            MANAGED_CONFIGURATION
        )
    except ApiException as e:
        if e.status != 404:
            raise


def refused_at_admission(api: client.ApiClient, namespace: str) -> str | None:
    """Create an incompatible PDDeployment (MTP k differs, mtpModules undeclared): the API
    server's refusal when the webhook answered, else None (the object admitted is deleted
    again: the configuration was not read yet, or no webhook served it)."""
    try:
        create_pdd(api, namespace, PDDBuilder("bad").mtp(3).prefill(k=2).dict())
    except ApiException as e:
        return str(e.body)
    client.CustomObjectsApi(api).delete_namespaced_custom_object(
        *CUSTOM, namespace, v.PLURAL, "bad"
    )
    return None


def get_pdd(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
        *CUSTOM, namespace, v.PLURAL, name
    )
    return obj


def create_pdd(api: client.ApiClient, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    """Create `body` in `namespace`, judged only if it says how (`builders.unjudged`)."""
    body = unjudged({**body, "metadata": {**body["metadata"], "namespace": namespace}})
    obj: dict[str, Any] = client.CustomObjectsApi(api).create_namespaced_custom_object(
        *CUSTOM, namespace, v.PLURAL, body
    )
    return obj


def patch_spec(api: client.ApiClient, namespace: str, name: str, spec: dict[str, Any]) -> None:
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        *CUSTOM, namespace, v.PLURAL, name, {"spec": spec}
    )


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return dict(c)
    return None


def is_true(obj: dict[str, Any], type_: str) -> bool:
    c = condition(obj, type_)
    return c is not None and c["status"] == "True"


def settled(obj: dict[str, Any]) -> bool:
    """Available, rollout complete, and the status speaks of the current generation."""
    status = obj.get("status") or {}
    progressing = condition(obj, "Progressing")
    return (
        status.get("observedGeneration") == obj["metadata"]["generation"]
        and is_true(obj, "Available")
        and progressing is not None
        and progressing["reason"] == "RolloutComplete"
    )


def wait_settled(
    api: client.ApiClient, namespace: str, name: str, timeout: float = 120
) -> dict[str, Any]:
    """The PDDeployment once it is `settled`; on a timeout, what its status said last."""
    last: dict[str, Any] = {}

    def probe() -> dict[str, Any] | None:
        last.update(get_pdd(api, namespace, name))
        return last if settled(last) else None

    try:
        found: dict[str, Any] = wait_for(probe, f"{name} settled", timeout, interval=0.5)
    except TimeoutError as e:
        status = last.get("status") or {}
        said = {
            "conditions": [
                f"{c['type']}={c['status']} {c.get('reason')}: {c.get('message')}"
                for c in status.get("conditions") or []
            ],
            "waitingFor": status.get("waitingFor"),
            "rollout": status.get("rollout"),
        }
        raise TimeoutError(f"{e}; its status last said {said}") from None
    return found


# The annotations that steer KWOK's fake pods (hack/kwok/README.md).
READY_DELAY = "pdmtp.io/fake-ready-delay-ms"
TERMINATE_MESSAGE = "pdmtp.io/fake-terminate-message"
EXIT_CODE = "pdmtp.io/fake-exit-code"


def engine_refusal(message: str) -> dict[str, str]:
    """Pod annotations under which KWOK ends the engine as the launcher does on a refusal."""
    return {TERMINATE_MESSAGE: message, EXIT_CODE: str(v.LAUNCHER_REFUSED_EXIT_CODE)}


def ready_after(b: PDDBuilder, ms: int = 800) -> PDDBuilder:
    """Engine pods of both roles that turn Ready `ms` after they start, so rollouts take steps."""
    annotations = {READY_DELAY: str(ms)}
    return b.prefill(podAnnotations=annotations).decode(podAnnotations=annotations)


# ---- invariants watcher ----------------------------------------------------------------------


@dataclass
class RolloutWatcher:
    """Feeds every Pod/Deployment event of one PDDeployment to the core's invariant checker
    (`pdmtp.core.rollout.invariants`, the one the planner's simulator uses) and collects violations.
    The floor counts what a client can reach, as the planner does: Ready pods, not leaving, of
    revisions whose router Deployment has replicas (a parked one has none) and a Ready pod
    (`RevisionState.reachable`, read off the Deployments by `observe.revision_states`).

    Pods and Deployments come on two watch streams, and one may deliver an event later than the
    other delivers a newer one (a router Deployment scaled to zero arriving before the pod that
    turned Ready just before it): the view would show a moment that never was. So events are
    applied in resourceVersion order across both streams (etcd's one sequence), an event once
    no stream can still deliver an older one (each stream delivers in order) or once it has
    waited REORDER_SECONDS; each is checked at the time it arrived."""

    api: client.ApiClient
    namespace: str
    name: str
    policy: Policy
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    deployments: dict[str, dict[str, Any]] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    views: list[str] = field(default_factory=list)
    """What the watcher saw at the first violations (at most 5)."""
    events_seen: int = 0
    forgive_surplus: bool = False
    """Leave out live pods beyond their Deployment's replicas (newest first). An API server
    that dies mid-create loses the answer, and the ReplicaSet controller makes the pod again:
    one too many, deleted soon after. Kubernetes' doing, not a decision of the operator's.
    Engine roles only: a router Deployment rolls its own pods when its listing changes, and the
    surge pod it starts is real (clients reach what it lists), so every router pod counts."""
    monitor: InvariantMonitor = field(init=False)
    _surplus: set[str] = field(default_factory=set)
    """Pods left out as a surplus at some point."""
    _counted: set[str] = field(default_factory=set)
    """Pods counted while they lived."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _pending: list[_Change] = field(default_factory=list)
    """Events received and not applied yet, a heap by resourceVersion."""
    _frontier: dict[str, int] = field(default_factory=dict)
    """Per stream, the resourceVersion of the last event or list it delivered."""
    _received: Iterator[int] = field(default_factory=itertools.count)
    _last_check: float = 0.0

    def __post_init__(self) -> None:
        # The watcher sees a router stop a moment after the operator decided it: forgive that
        # lag on the drain check (invariant 4).
        self.monitor = InvariantMonitor(self.policy, tolerance=1.0)

    @classmethod
    def watching(
        cls, api: client.ApiClient, namespace: str, name: str, b: PDDBuilder
    ) -> RolloutWatcher:
        """A watcher started on the spec `b` builds, under that spec's rollout policy."""
        spec = b.build().spec
        watcher = cls(api, namespace, name, target_and_policy(check(spec))[1])
        watcher.start(spec)
        return watcher

    def start(self, spec: PDDeploymentSpec) -> None:
        """Watch, holding the rollout to `spec` (the one serving now) until `expect` moves it."""
        core, apps = client.CoreV1Api(self.api), client.AppsV1Api(self.api)
        selector = f"{v.LABEL_NAME}={self.name}"
        for what, lister in (
            ("pod", core.list_namespaced_pod),
            ("deployment", apps.list_namespaced_deployment),
        ):
            t = threading.Thread(target=self._follow, args=(what, lister, selector), daemon=True)
            t.start()
            self._threads.append(t)
        ticker = threading.Thread(target=self._tick, daemon=True)
        ticker.start()
        self._threads.append(ticker)
        time.sleep(0.5)
        self.expect(spec)

    def expect(self, spec: PDDeploymentSpec) -> None:
        """The spec is about to become `spec`: bounds and the anchor from what serves now."""
        target, _ = target_and_policy(check(spec))
        with self._lock:
            self._apply_pending(flush=True)
            before = dict(self.monitor.max_pods)
            self.monitor.retarget(self._states(), target)
            # What the operator decided for the previous spec may still land after this (a pod it
            # created just before it saw a smaller one): the pods ceiling keeps the higher of
            # the two. The simulator, which has no such lag, checks the exact bounds.
            for role, ceiling in before.items():
                self.monitor.max_pods[role] = max(ceiling, self.monitor.max_pods[role])

    def rescale(self, spec: PDDeploymentSpec) -> None:
        """The same roll at the counts of `spec` (an autoscaler's): bounds move, the anchor
        stays; as in `expect`, the pods ceiling keeps the higher of old and new."""
        target, _ = target_and_policy(check(spec))
        with self._lock:
            self._apply_pending(flush=True)
            before = dict(self.monitor.max_pods)
            self.monitor.rescale(self._states(), target)
            for role, ceiling in before.items():
                self.monitor.max_pods[role] = max(ceiling, self.monitor.max_pods[role])

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)
        with self._lock:
            self._apply_pending(flush=True)

    def _follow(self, what: str, lister: Any, selector: str) -> None:
        """List, then watch from the list's resourceVersion; on every reconnect list again and
        replace the view, so a pod deleted while no watch was open never lingers in it."""
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                listed = lister(self.namespace, label_selector=selector)
                items = {
                    i.metadata.name: self.api.sanitize_for_serialization(i) for i in listed.items
                }
                with self._lock:
                    self._receive(what, "LIST", None, items, listed.metadata.resource_version)
                for event in w.stream(
                    lister,
                    self.namespace,
                    label_selector=selector,
                    resource_version=listed.metadata.resource_version,
                    timeout_seconds=30,
                    _preload_content=False,
                ):
                    raw = event["raw_object"]
                    if event["type"] == "ERROR":
                        break  # e.g. 410 Gone: list again
                    key = raw["metadata"]["name"]
                    with self._lock:
                        rv = raw["metadata"].get("resourceVersion")
                        self._receive(what, event["type"], key, raw, rv)
                    if self._stop.is_set():
                        break
            except Exception:  # a dropped watch is re-opened after a fresh list
                if not self._stop.is_set():
                    time.sleep(0.2)
            finally:
                w.stop()

    def _tick(self) -> None:
        """Apply what waited long enough while neither stream delivers anything."""
        while not self._stop.wait(REORDER_SECONDS / 4):
            with self._lock:
                self._apply_pending()

    def _receive(self, what: str, kind: str, key: str | None, obj: Any, rv: str | None) -> None:
        """Queue one event (or a list, which replaces the stream's view) and apply what may be."""
        version = int(rv) if rv and rv.isdigit() else 0
        change = _Change(version, next(self._received), time.time(), what, kind, key, obj)
        heapq.heappush(self._pending, change)
        self._frontier[what] = max(self._frontier.get(what, 0), version)
        self._apply_pending()

    def _apply_pending(self, flush: bool = False) -> None:
        """Apply, in resourceVersion order, every queued event no stream can still precede."""
        settled = min(self._frontier.get(w, 0) for w in ("pod", "deployment"))
        while self._pending:
            first = self._pending[0]
            late = time.time() - first.arrived > REORDER_SECONDS
            if not (flush or late or first.version <= settled):
                return
            heapq.heappop(self._pending)
            store = self.pods if first.what == "pod" else self.deployments
            if first.kind == "LIST":
                store.clear()
                store.update(first.obj)
                label = f"LIST {first.what}s"
            else:
                if first.kind == "DELETED":
                    store.pop(first.key or "", None)
                else:
                    store[first.key or ""] = first.obj
                self.events_seen += 1
                label = f"{first.kind} {first.what} {first.key}"
            # Arrival time, never going back: the drain check (invariant 4) reads the clock.
            self._last_check = max(self._last_check, first.arrived)
            self._check(label, self._last_check)

    # Checks run under the lock, over the watcher's view of the namespace.

    def _states(self) -> list[RevisionState]:
        # A multi-node role has no Deployment: its live groups are its replicas (`grouping`).
        groups = groups_of(list(self.pods.values()), [])
        return revision_states([*self.deployments.values(), *workloads(groups)], self._pods())

    def _pods(self) -> list[dict[str, Any]]:
        """The pods as the core counts replicas: each multi-node group folded into one unit."""
        return [dict(p) for p in units(self._kept(), [])]

    def _kept(self) -> list[dict[str, Any]]:
        pods = list(self.pods.values())
        if not self.forgive_surplus:
            return pods
        wanted = {
            name: (d.get("spec") or {}).get("replicas", 0) for name, d in self.deployments.items()
        }
        kept: list[dict[str, Any]] = []
        live: dict[str, int] = {}
        # Kept in the order the ReplicaSet controller keeps pods when it removes a surplus: Ready
        # first, then the highest pod-deletion-cost (the operator gives a pod leaving routing
        # the lowest, so that one goes), then the oldest.
        # A pod never counted while it lived (surplus all along: the ReplicaSet's duplicate) stays
        # left out while it terminates; one counted before (a scale-down's) counts to the end.
        for p in sorted(pods, key=_surplus_keep_order):
            labels = labels_of(p)
            role = cast(Role, labels.get(v.LABEL_ROLE))
            workload = names.workload(self.name, labels.get(v.LABEL_REVISION, ""), role)
            if workload in wanted and role in v.ENGINE_ROLES:
                if is_terminating(p):
                    if name_of(p) in self._surplus and name_of(p) not in self._counted:
                        continue
                else:
                    live[workload] = live.get(workload, 0) + 1
                    if live[workload] > wanted[workload]:
                        self._surplus.add(name_of(p))
                        continue
                    self._counted.add(name_of(p))
            kept.append(p)
        return kept

    def _check(self, label: str, now: float) -> None:
        if self.monitor.target is None:
            return  # not started yet
        terminating = [
            Terminating(name_of(p), labels_of(p)[v.LABEL_REVISION], labels_of(p)[v.LABEL_ROLE])
            for p in self._pods()
            if is_terminating(p) and labels_of(p).get(v.LABEL_ROLE) in v.ENGINE_ROLES
        ]
        listed = _listed_engines(self._pods())
        moment = Moment(now, self._states(), terminating, label, listed)
        broken = self.monitor.check(moment)
        if broken and len(self.views) < 5:
            self.views.append(f"{label}: {self._view()}")
        self.violations += broken
        pods = list(self.pods.values())
        self.violations += [
            f"{x} at {label}" for x in foreign_routes(self.deployments.values(), pods)
        ]
        self.violations += [f"{x} at {label}" for x in partial_routes(pods)]

    def _view(self) -> str:
        """The pods and Deployments as the watcher saw them, to explain a violation."""
        pods = [
            f"{name_of(p)}({'ready' if pod_ready(p) else 'unready'}"
            f"{', terminating' if is_terminating(p) else ''}, "
            f"{p['metadata'].get('creationTimestamp')})"
            for p in sorted(self.pods.values(), key=name_of)
        ]
        replicas = {n: (d.get("spec") or {}).get("replicas") for n, d in self.deployments.items()}
        return f"pods {pods}; deployment replicas {dict(sorted(replicas.items()))}"

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "pods": len(self.pods),
                "deployments": sorted(self.deployments),
                "events": self.events_seen,
            }


REORDER_SECONDS = 2.0
"""How long an event may wait for an older one still on its way on the other stream."""


@dataclass(frozen=True, order=True)
class _Change:
    """One watch event (or a list) as received, ordered by resourceVersion, then arrival."""

    version: int
    received: int
    arrived: float = field(compare=False)
    what: str = field(compare=False)
    kind: str = field(compare=False)
    """ADDED, MODIFIED, DELETED, or LIST (the stream's whole view, `obj` by name)."""
    key: str | None = field(compare=False)
    obj: Any = field(compare=False)


def partial_routes(pods: list[dict[str, Any]]) -> list[str]:
    """Routes to a multi-node group that does not serve whole: a router pod listing a pod that
    is not a group's leader, or the leader of a group with a member missing."""
    routers = [p for p in pods if labels_of(p).get(v.LABEL_ROLE) == "router"]
    listed = set().union(*(router_urls(_args(r)) for r in routers)) if routers else set()
    out = []
    for g in groups_of(pods, []):
        for rank, pod in g.members.items():
            ip = (pod.get("status") or {}).get("podIP")
            if not ip or engine_url(ip) not in listed:
                continue
            if rank != 0:
                out.append(f"a router lists {name_of(pod)}, rank {rank} of {g.group_id}")
            elif not g.complete:
                out.append(f"a router lists {name_of(pod)}, leader of incomplete {g.group_id}")
    return out


def _args(pod: dict[str, Any]) -> list[str]:
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return list(containers[0].get("args") or [])


def _surplus_keep_order(pod: dict[str, Any]) -> tuple[bool, int, str]:
    cost = (pod["metadata"].get("annotations") or {}).get(v.ANNOTATION_DELETION_COST, "0")
    try:
        rank = -int(cost)
    except ValueError:
        rank = 0
    return (not pod_ready(pod), rank, pod["metadata"].get("creationTimestamp") or "")


def table(api: client.ApiClient, namespace: str) -> tuple[list[str], list[list[Any]]]:
    """`kubectl get pdd` as the API server renders it (printer columns)."""
    path = f"/apis/{v.GROUP}/{v.VERSION}/namespaces/{namespace}/{v.PLURAL}"
    m, url, headers, _, _ = api.param_serialize(
        "GET",
        path,
        header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
        auth_settings=["BearerToken"],
    )
    raw = api.call_api(m, url, header_params=headers).read()
    doc = json.loads(raw)
    columns = [c["name"] for c in doc["columnDefinitions"]]
    return columns, [row["cells"] for row in doc["rows"]]


def objects_dump(api: client.ApiClient, namespace: str) -> Iterator[str]:
    """Events, PDDeployments and children of a namespace, for a failed test's report."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    for e in core.list_namespaced_event(namespace).items:
        what = f"{e.involved_object.kind}/{e.involved_object.name}"
        yield f"event {e.type} {e.reason} {what}: {e.message}"
    for d in apps.list_namespaced_deployment(namespace).items:
        yield (
            f"deployment {d.metadata.name} replicas={d.spec.replicas} "
            f"ready={d.status.ready_replicas} ann={d.metadata.annotations}"
        )
    for p in core.list_namespaced_pod(namespace).items:
        deleting = bool(p.metadata.deletion_timestamp)
        yield f"pod {p.metadata.name} phase={p.status.phase} ip={p.status.pod_ip} {deleting=}"
    custom = client.CustomObjectsApi(api)
    for obj in custom.list_namespaced_custom_object(*CUSTOM, namespace, v.PLURAL)["items"]:
        yield "pdd " + json.dumps(obj.get("status"), indent=1)


def _listed_engines(pods: Iterable[dict[str, Any]]) -> dict[str, frozenset[str]]:
    """Per revision, the engine pods (by name, terminating ones too) that some router pod of that
    revision, terminating ones too, lists: invariant 8's view (`core.rollout.invariants`)."""
    pods = list(pods)
    urls = listed_urls(removal_view(pods)[1])
    out: dict[str, set[str]] = {}
    for pod in pods:
        labels = labels_of(pod)
        revision, ip = labels.get(v.LABEL_REVISION, ""), (pod.get("status") or {}).get("podIP")
        listed = ip and engine_url(ip) in urls.get(revision, frozenset())
        if labels.get(v.LABEL_ROLE) in v.ENGINE_ROLES and listed:
            out.setdefault(revision, set()).add(name_of(pod))
    return {rev: frozenset(names) for rev, names in out.items()}

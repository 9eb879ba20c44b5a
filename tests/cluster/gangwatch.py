"""Watch pod groups being bound, at every watch event: the cluster tier's gang-scheduling check.

`GangWatch` lists the pods of a label selector, then follows their watch in a thread. At every
event it records, per group, how many members exist, how many are bound (`spec.nodeName` set)
and, given a node label (the rack), which values of it the bound members' nodes carry. Groups
are pods sharing the value of a label key, or (by default) `spec.schedulingGroup.podGroupName`.

Violations:
- "partly bound": some but not all of a group's expected members bound, where the expected size
  is given per group or read from the PodGroup's `spec.schedulingPolicy.gang.minCount`. A gang's
  members are bound by one API call each, so a watch sees the first bound a moment before the
  second even under a perfect gang (the scheduler has already reserved every member's node);
  such a state is a violation when it lasts longer than `settle` seconds (0: at any event).
- "spans": the bound members of a group are on nodes with two values of the node label.

Raw JSON throughout: the client's typed V1Pod has no `schedulingGroup` and would drop it. Every
request goes to the API server of the caller's ApiClient (the cluster tier's loopback one).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cluster.kubehelpers import wait_for
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from localcluster import fake_gpu_node

SCHEDULING_GROUP = "scheduling.k8s.io"
TEST_KEY = "gang.pdmtp.io/test"  # node label and taint key; the value is unique per test
# The PodGroup's status condition the scheduler sets (k8s.io/api scheduling/<version>/types.go):
# renamed in v1beta1, which says it covers scheduling "till first success".
SCHEDULED_CONDITION = {"v1alpha2": "PodGroupScheduled", "v1beta1": "PodGroupInitiallyScheduled"}


@dataclass
class GangNodes:
    """Free 8-GPU KWOK nodes of one test only: labelled and tainted TEST_KEY=<tag>, so only pods
    with `node_selector` and `toleration` land there, and the shared nodes are never counted on."""

    api: client.ApiClient
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    names: list[str] = field(default_factory=list)

    @property
    def node_selector(self) -> dict[str, str]:
        return {TEST_KEY: self.tag}

    @property
    def toleration(self) -> dict[str, str]:
        return {"key": TEST_KEY, "operator": "Equal", "value": self.tag, "effect": "NoSchedule"}

    def add(self, rack: str) -> str:
        """A node in `rack`; returns once the scheduler may use it (Ready, no taint but ours)."""
        core = client.CoreV1Api(self.api)
        name = f"gang-{self.tag}-{len(self.names)}"
        taint = {"key": TEST_KEY, "value": self.tag, "effect": "NoSchedule"}
        core.create_node(fake_gpu_node(name, rack, self.node_selector, [taint]))
        self.names.append(name)

        def usable() -> bool:
            node = core.read_node(name)
            ready = {c.type: c.status for c in node.status.conditions or []}
            foreign = [t.key for t in node.spec.taints or [] if t.key != TEST_KEY]
            return ready.get("Ready") == "True" and not foreign

        wait_for(usable, f"node {name} Ready and untainted", 30)
        return name

    def delete(self) -> None:
        for name in self.names:
            try:
                client.CoreV1Api(self.api).delete_node(name)
            except ApiException as exc:
                if exc.status != 404:
                    raise


def served_podgroup_version(api_client: client.ApiClient) -> str | None:
    """The scheduling.k8s.io version whose discovery lists `podgroups` (None: not served)."""
    for group in client.ApisApi(api_client).get_api_versions().groups:
        if group.name != SCHEDULING_GROUP:
            continue
        for version in group.versions:
            method, url, headers, _, _ = api_client.param_serialize(
                "GET", f"/apis/{version.group_version}", auth_settings=["BearerToken"]
            )
            doc = json.loads(api_client.call_api(method, url, header_params=headers).read())
            if any(r["name"] == "podgroups" for r in doc.get("resources", [])):
                return str(version.version)
    return None


@dataclass(frozen=True)
class GroupState:
    members: int  # pods of the group that exist (terminating ones included)
    bound: int  # of those, with spec.nodeName
    expected: int | None  # the size the caller gave, else the PodGroup's gang minCount
    domains: frozenset[str]  # values of the node label on the bound members' nodes

    @property
    def partly_bound(self) -> bool:
        size = self.expected if self.expected is not None else self.members
        return 0 < self.bound < size


@dataclass(frozen=True)
class Observation:
    seq: int
    at: float  # seconds since the watch started
    event: str  # LIST, ADDED, MODIFIED, DELETED
    pod: str
    groups: dict[str, GroupState]


@dataclass
class GangWatch:
    """Follow the pods of `selector` in `namespace`; see the module docstring.

    Use as a context manager (or start()/stop()); the thread ends by itself after `timeout`
    seconds. `sizes` gives groups' expected sizes; groups not in it read their PodGroup (in
    `podgroup_version`, discovered when not given) for the gang minCount.
    """

    api_client: client.ApiClient
    namespace: str
    selector: str
    group_label: str | None = None
    node_label: str | None = None
    sizes: dict[str, int] = field(default_factory=dict)
    podgroup_version: str | None = None
    settle: float = 2.0
    timeout: float = 300.0
    observations: list[Observation] = field(default_factory=list)
    bound_at: dict[str, float] = field(default_factory=dict)
    """When each pod was first seen bound (seconds since the start)."""
    expired: bool = False
    _pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    _domains: dict[str, str] = field(default_factory=dict)
    _min_count: dict[str, int] = field(default_factory=dict)
    _partial_since: dict[str, float] = field(default_factory=dict)
    _partial: list[tuple[str, float, float]] = field(default_factory=list)
    _spans: list[str] = field(default_factory=list)
    _error: BaseException | None = None
    _t0: float = 0.0
    _rv: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Condition = field(default_factory=threading.Condition)
    _thread: threading.Thread | None = None
    core: client.CoreV1Api = field(init=False)

    # ---- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> GangWatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api_client)

    def start(self) -> GangWatch:
        """List synchronously (nothing after this call is missed), then watch in a thread."""
        if self.podgroup_version is None and self.group_label is None:
            self.podgroup_version = served_podgroup_version(self.api_client)
        self._t0 = time.monotonic()
        self._list()
        self._thread = threading.Thread(target=self._run, name="gangwatch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the watch (within the 2 s server-side timeout of the open request)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(15)
            if self._thread.is_alive():
                raise TimeoutError("gangwatch thread did not stop in 15 s")
        with self._lock:
            self._close_partials(self.elapsed())
        if self._error is not None:
            raise RuntimeError(f"gangwatch failed: {self._error!r}") from self._error

    # ---- what it saw ---------------------------------------------------------------------------
    def history(self) -> list[Observation]:
        """Every observation so far (a copy)."""
        with self._lock:
            return list(self.observations)

    def latest(self) -> dict[str, GroupState]:
        with self._lock:
            return dict(self.observations[-1].groups) if self.observations else {}

    def wait(
        self, predicate: Callable[[dict[str, GroupState]], bool], what: str, timeout: float = 60
    ) -> Observation:
        """The first observation, the latest one or any after it, whose groups satisfy
        `predicate`."""
        with self._lock:
            seen = max(len(self.observations) - 1, 0)

        def probe() -> Observation | None:
            nonlocal seen
            if self._error is not None or (self._thread and not self._thread.is_alive()):
                raise RuntimeError(f"gangwatch ended (expired={self.expired}): {self._error!r}")
            with self._lock:
                for observation in self.observations[seen:]:
                    if predicate(observation.groups):
                        return observation
                seen = len(self.observations)
                self._lock.wait(0.2)
            return None

        return wait_for(probe, what, timeout, interval=0)

    def partly_bound(self) -> list[str]:
        """Partly-bound states that lasted longer than `settle` (ended, or still open now)."""
        with self._lock:
            now = self.elapsed()
            spans = [*self._partial, *((g, t, now) for g, t in self._partial_since.items())]
        return [
            f"group {g} partly bound for {end - start:.3f}s from t=+{start:.3f}s"
            for g, start, end in spans
            if end - start > self.settle
        ]

    def transient_partials(self) -> list[tuple[str, float, float]]:
        """Every partly-bound interval seen (group, start, end): the binding gaps of a gang."""
        with self._lock:
            return list(self._partial)

    def spans(self) -> list[str]:
        with self._lock:
            return list(self._spans)

    def violations(self) -> list[str]:
        return self.partly_bound() + self.spans()

    def report(self, last: int = 40) -> str:
        """The last observations, one line each, for an assertion message."""
        with self._lock:
            lines = [
                f"#{o.seq} +{o.at:.3f}s {o.event} {o.pod}: "
                + ", ".join(
                    f"{g}={s.bound}/{s.expected or s.members} bound"
                    + (f" on {sorted(s.domains)}" if s.domains else "")
                    for g, s in sorted(o.groups.items())
                )
                for o in self.observations[-last:]
            ]
        return "\n".join(lines)

    # ---- internals -----------------------------------------------------------------------------
    def elapsed(self) -> float:
        """Seconds since the watch started (the clock of every recorded time)."""
        return time.monotonic() - self._t0

    def _list(self) -> None:
        resp = self.core.list_namespaced_pod(
            self.namespace, label_selector=self.selector, _preload_content=False
        )
        doc = json.loads(resp.data)
        with self._lock:
            self._pods = {p["metadata"]["name"]: p for p in doc["items"]}
            self._rv = doc["metadata"]["resourceVersion"]
            self._observe("LIST", "")

    def _run(self) -> None:
        deadline = self._t0 + self.timeout
        try:
            while not self._stop.is_set():
                if time.monotonic() > deadline:
                    self.expired = True
                    return
                try:
                    self._watch_once()
                except ApiException as exc:
                    if exc.status != 410:
                        raise
                    self._list()  # resourceVersion too old: start over from a fresh list
        except BaseException as exc:  # reported by stop() and wait()
            self._error = exc
        finally:
            with self._lock:
                self._lock.notify_all()

    def _watch_once(self) -> None:
        w = watch.Watch()
        try:
            for event in w.stream(
                self.core.list_namespaced_pod,
                self.namespace,
                label_selector=self.selector,
                resource_version=self._rv,
                allow_watch_bookmarks=True,
                timeout_seconds=2,
                _request_timeout=(5, 10),
                deserialize=False,
            ):
                kind, raw = event["type"], event["object"]
                if kind == "ERROR":
                    raise ApiException(status=raw.get("code"), reason=raw.get("message"))
                with self._lock:
                    self._rv = raw["metadata"]["resourceVersion"]
                    if kind == "BOOKMARK":
                        continue
                    name = raw["metadata"]["name"]
                    if kind == "DELETED":
                        self._pods.pop(name, None)
                    else:
                        self._pods[name] = raw
                    self._observe(kind, name)
                if self._stop.is_set():
                    return
        finally:
            w.stop()

    def _group_of(self, pod: dict[str, Any]) -> str | None:
        if self.group_label is not None:
            value = (pod["metadata"].get("labels") or {}).get(self.group_label)
            return str(value) if value is not None else None
        ref = pod["spec"].get("schedulingGroup") or {}
        name = ref.get("podGroupName")
        return str(name) if name else None

    def _domain(self, node: str) -> str:
        if node not in self._domains:
            try:
                labels = self.core.read_node(node).metadata.labels or {}
                self._domains[node] = labels.get(self.node_label or "", "<none>")
            except ApiException as exc:
                return f"<node {node}: {exc.status}>"
        return self._domains[node]

    def _expected(self, group: str) -> int | None:
        if group in self.sizes:
            return self.sizes[group]
        if group not in self._min_count and self.podgroup_version and self.group_label is None:
            try:
                pg = client.CustomObjectsApi(self.api_client).get_namespaced_custom_object(
                    SCHEDULING_GROUP, self.podgroup_version, self.namespace, "podgroups", group
                )
            except ApiException as exc:
                if exc.status != 404:  # not created yet: look again at the next event
                    raise
                return None
            gang = (pg["spec"].get("schedulingPolicy") or {}).get("gang") or {}
            if "minCount" in gang:
                self._min_count[group] = int(gang["minCount"])
        return self._min_count.get(group)

    def _observe(self, kind: str, name: str) -> None:
        """Called with the lock held, after every change to the pods."""
        now = self.elapsed()
        members: dict[str, list[dict[str, Any]]] = {}
        for pod in self._pods.values():
            group = self._group_of(pod)
            if group is not None:
                members.setdefault(group, []).append(pod)
        groups: dict[str, GroupState] = {}
        for group, pods in members.items():
            nodes = [p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")]
            for p in pods:
                if p["spec"].get("nodeName"):
                    self.bound_at.setdefault(p["metadata"]["name"], now)
            domains = frozenset(self._domain(n) for n in nodes) if self.node_label else frozenset()
            groups[group] = GroupState(len(pods), len(nodes), self._expected(group), domains)
        seq = len(self.observations)
        self.observations.append(Observation(seq, now, kind, name, groups))
        for group, state in groups.items():
            if state.partly_bound:
                self._partial_since.setdefault(group, now)
            elif group in self._partial_since:
                self._partial.append((group, self._partial_since.pop(group), now))
            if len(state.domains) > 1:
                self._spans.append(
                    f"#{seq} +{now:.3f}s {kind} {name}: group {group} spans "
                    f"{self.node_label} values {sorted(state.domains)}"
                )
        for group in [g for g in self._partial_since if g not in groups]:
            self._partial.append((group, self._partial_since.pop(group), now))
        self._lock.notify_all()

    def _close_partials(self, now: float) -> None:
        for group in list(self._partial_since):
            self._partial.append((group, self._partial_since.pop(group), now))

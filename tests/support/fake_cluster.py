"""An in-memory stand-in for the API server and the Deployment controller, for unit tests of the
pure reconcile: it applies a decision's actions, makes pods for Deployments, and hands back what
the shell would observe. Nothing here is asserted on; tests assert on the decisions.

Given a random source (`rng`), it is a simulation instead (test_group_simulation): new pods start
unready and become Ready in an order the random source decides (`tick`), a gang is placed when it
says, a deleted pod lingers terminating for `linger` ticks (an unbound one goes at once), the
ReplicaSet ranks its victims as the real one does (unready first, then the lowest deletion cost,
then the newest), a router Deployment rolls a new pod first (maxSurge 1, maxUnavailable 0), new
objects carry the simulation's clock as their creationTimestamp, and `reconcile` applies the
actions as the shell does: in order, stopping at the first one the API server refuses (an
annotation of a pod that is gone: 404), with the status built from what was refused."""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field
from typing import Any

from pdmtp.api import vocabulary as v
from pdmtp.core.actions import Action, Annotate, Apply, Delete, Rejection, Scale
from pdmtp.core.context import Observed
from pdmtp.core.hashing import short_hash
from pdmtp.core.objects import format_time, parse_time
from pdmtp.core.reconcile import Decision, decide
from pdmtp.core.windows import PodMetrics

Obj = dict[str, Any]
CREATED = "2027-01-15T08:00:00Z"


@dataclass
class FakeCluster:
    """Children of one PDDeployment in namespace `ns`, keyed `Kind/name`."""

    body: Obj
    objects: dict[str, Obj] = field(default_factory=dict)
    pods: dict[str, Obj] = field(default_factory=dict)
    next_ip: int = 10
    workload_api: str | None = "scheduling.k8s.io/v1beta1"
    """What the API server serves of the Workload API (None: a cluster without it)."""
    rng: random.Random | None = None
    """Set: a simulation (see the module docstring); None: pods are made and go at once."""
    linger: int = 0
    """Simulation: ticks a deleted pod stays terminating (a preStop, the grace period)."""
    ready_chance: float = 0.5
    """Simulation: the chance, per tick, that a running unready pod becomes Ready."""
    place_chance: float = 0.7
    """Simulation: the chance, per tick, that a gang whose pods all exist is placed."""
    now: float | None = None
    """Simulation: the clock (`reconcile` sets it), stamped on what is created and deleted."""
    countdown: dict[str, int] = field(default_factory=dict)
    """Simulation: terminating pods and the ticks they have left."""
    refusals: list[Rejection] = field(default_factory=list)
    """Simulation: every write the API server refused, in order."""
    metrics: dict[str, PodMetrics] = field(default_factory=dict)
    """The engine pods' scrapes by pod name, as the scraper would hand them over."""
    unique_names: bool = False
    """New pods get names never used before (as the ReplicaSet's random suffixes are), not the
    lowest free index: a pod's scrapes then never pass to its replacement."""
    cordoned: frozenset[str] = frozenset()
    """Nodes marked unschedulable (a drain begun): new pods never land there (each new pod gets
    a node of its own)."""

    @property
    def simulating(self) -> bool:
        return self.rng is not None

    def _ip(self) -> str:
        """The next pod's address (unique; past 192.0.2.255 a long simulation goes on in 10/8)."""
        n = self.next_ip
        return f"192.0.2.{n}" if n < 256 else f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}"

    def _stamp(self) -> str:
        return format_time(self.now) if self.simulating and self.now is not None else CREATED

    def observed(self) -> Observed:
        deployments = [o for k, o in self.objects.items() if k.startswith("Deployment/")]
        others = [o for k, o in self.objects.items() if not k.startswith("Deployment/")]
        if self.workload_api is None:
            others = [o for o in others if o.get("kind") != v.POD_GROUP_KIND]
        return Observed(
            copy.deepcopy(self.body),
            deployments,
            list(self.pods.values()),
            others,
            metrics=dict(self.metrics),
            workload_api=self.workload_api,
            cordoned=self.cordoned,
        )

    def reconcile(self, now: float) -> Decision:
        """One decide, its actions applied and its status stored, as the shell would."""
        if self.simulating:
            return self._reconcile_as_the_shell(now)
        decision = decide(self.observed(), now)
        self.apply(decision)
        if decision.status_changed:
            self.body["status"] = copy.deepcopy(decision.status)
        return decision

    def _reconcile_as_the_shell(self, now: float) -> Decision:
        self.now = now
        decision = decide(self.observed(), now)
        refused: list[Rejection] = []
        unapplied: tuple[str, ...] = ()
        for i, action in enumerate(decision.actions):
            refusal = self._refusal(action)
            if refusal is not None:
                refused.append(refusal)
                unapplied = tuple(a.key for a in decision.actions[i:])
                break
            self.apply_some(Decision((action,), None))
        self.refusals += refused
        report = decision.report(refused, unapplied)
        if report.status_changed:
            self.body["status"] = copy.deepcopy(report.written)
        return decision

    def _refusal(self, action: Action) -> Rejection | None:
        """What the API server refuses of a write (the simulation's shell stops there)."""
        if isinstance(action, Annotate) and action.name not in self.pods:
            return Rejection(action.key, 404, f'pods "{action.name}" not found')
        return None

    def apply(self, decision: Decision) -> None:
        self.apply_some(decision)

    def apply_some(self, decision: Decision, refused: set[str] | None = None) -> None:
        """Apply the decision's actions except those whose key is in `refused`."""
        for action in decision.actions:
            if action.key in (refused or set()):
                continue
            if isinstance(action, Apply) and action.kind == "Pod":
                # A multi-node group's pod: created directly, unbound until its gang places.
                pod = copy.deepcopy(action.manifest)
                pod["metadata"]["creationTimestamp"] = self._stamp()
                pod["metadata"]["uid"] = f"uid-{pod['metadata']['name']}" + (
                    f"-{self.next_ip}" if self.simulating else ""  # a name reused: a new uid
                )
                pod["status"] = {"phase": "Pending"}
                self.pods.setdefault(pod["metadata"]["name"], pod)
            elif isinstance(action, Apply):
                manifest = copy.deepcopy(action.manifest)
                old = self.objects.get(action.key)
                created = (old or {}).get("metadata", {}).get("creationTimestamp", self._stamp())
                manifest["metadata"]["creationTimestamp"] = created
                self.objects[action.key] = manifest
            elif isinstance(action, Scale):
                self.objects[f"Deployment/{action.name}"]["spec"]["replicas"] = action.replicas
            elif isinstance(action, Annotate):
                notes = self.pods[action.name]["metadata"].setdefault("annotations", {})
                for key, value in action.annotations.items():
                    if value is None:
                        notes.pop(key, None)
                    else:
                        notes[key] = value
            elif isinstance(action, Delete) and action.kind == "Pod":
                self.delete_pod(action.name)
            elif isinstance(action, Delete) and action.kind == v.POD_GROUP_KIND:
                self.objects.pop(action.key, None)
            elif isinstance(action, Delete) and action.kind == "Deployment":
                self.objects.pop(f"{action.kind}/{action.name}", None)
                for name in self.pods_named(action.name):
                    self.delete_pod(name)
            elif isinstance(action, Delete):
                # Owned by the PDDeployment, not by the object: a Service takes no pod with it.
                self.objects.pop(f"{action.kind}/{action.name}", None)

    def delete_pod(self, name: str) -> None:
        """Delete a pod: at once, or (simulating, a pod bound to a node) terminating first."""
        pod = self.pods.get(name)
        if pod is None or name in self.countdown:
            return
        if not self.simulating or self.linger <= 0 or not pod["spec"].get("nodeName"):
            del self.pods[name]
            return
        pod["metadata"]["deletionTimestamp"] = self._stamp()
        self.countdown[name] = self.linger

    def terminating(self, name: str) -> bool:
        return name in self.countdown

    def run_pods(self, ready: bool = True) -> None:
        """The Deployment controller and kubelet: every Deployment gets exactly its replicas,
        the lowest deletion cost deleted first, and a pod of an older template is replaced."""
        if self.simulating:
            for key, dep in list(self.objects.items()):
                if key.startswith("Deployment/"):
                    self._run_deployment(dep)
            return
        for key, dep in self.objects.items():
            if not key.startswith("Deployment/"):
                continue
            name = dep["metadata"]["name"]
            template = dep["spec"]["template"]
            stamp = short_hash(template, 10)
            mine = [n for n in self.pods if n.rsplit("-", 1)[0] == name]
            outdated = [n for n in mine if self._label(n, "pod-template-hash") != stamp]
            if outdated and (dep["spec"].get("minReadySeconds") or 0) > 0:
                self._held_roll(dep, stamp, dep["spec"]["replicas"], outdated, ready)
                continue
            for old in outdated:
                del self.pods[old]
            mine = sorted(
                (n for n in self.pods if n.rsplit("-", 1)[0] == name),
                key=lambda n: (int(self._note(n, v.ANNOTATION_DELETION_COST) or 0), n),
            )
            want = dep["spec"]["replicas"]
            for extra in mine[: max(len(mine) - want, 0)]:
                del self.pods[extra]
            for _ in range(want - len(self.pods_named(name))):
                self._new_pod(dep, stamp, ready)

    def place_groups(self, ready: bool = True) -> None:
        """The gang scheduler and the kubelets for multi-node groups: a PodGroup's pods are
        bound all at once, when all `minCount` exist, and then run (Ready if `ready`; simulating,
        unready, and a gang is placed only when the random source says so)."""
        for key, group in sorted(self.objects.items()):
            if not key.startswith(f"{v.POD_GROUP_KIND}/"):
                continue
            name = group["metadata"]["name"]
            members = [
                p
                for n, p in sorted(self.pods.items())
                if (p["spec"].get("schedulingGroup") or {}).get("podGroupName") == name
                and not self.terminating(n)
            ]
            if len(members) < group["spec"]["schedulingPolicy"]["gang"]["minCount"]:
                continue
            if self.rng is not None:
                if all(p["spec"].get("nodeName") for p in members):
                    continue
                if self.rng.random() >= self.place_chance:
                    continue
                ready = False
            for pod in members:
                if pod["spec"].get("nodeName"):
                    continue
                pod["spec"]["nodeName"] = f"node-{self.next_ip}"
                pod["status"] = {
                    "phase": "Running",
                    "podIP": self._ip(),
                    "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                }
                self.next_ip += 1

    # ---- the simulation ----------------------------------------------------------------------

    def tick(self) -> None:
        """Simulating, one step of the kubelets: terminating pods count down (and go), running
        unready pods become Ready by chance (a member set unready recovers the same way)."""
        assert self.rng is not None, "tick() is for a FakeCluster with a random source"
        for name in sorted(self.countdown):
            self.countdown[name] -= 1
            if self.countdown[name] <= 0:
                del self.countdown[name]
                self.pods.pop(name, None)
        for name, pod in sorted(self.pods.items()):
            status = pod.get("status") or {}
            if self.terminating(name) or status.get("phase") != "Running":
                continue
            conditions = status.get("conditions") or []
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                continue
            if self.rng.random() < self.ready_chance:
                status["conditions"] = [{"type": "Ready", "status": "True"}]

    def _ready(self, name: str) -> bool:
        conditions = (self.pods[name].get("status") or {}).get("conditions") or []
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        return ready and not self.terminating(name)

    def _created(self, name: str) -> float:
        return parse_time(self.pods[name]["metadata"].get("creationTimestamp")) or 0.0

    def _live(self, deployment: str) -> list[str]:
        return [n for n in self.pods_named(deployment) if not self.terminating(n)]

    def _run_deployment(self, dep: Obj) -> None:
        """Simulating: one Deployment's ReplicaSets. Engine pods of an older template are
        replaced; surplus pods go unready first, then the lowest deletion cost, then the
        newest; a router rolls a new pod before an old one goes."""
        name = dep["metadata"]["name"]
        stamp = short_hash(dep["spec"]["template"], 10)
        want = int(dep["spec"]["replicas"])
        if dep["metadata"]["labels"].get(v.LABEL_ROLE) == "router":
            self._roll_router(dep, stamp, want)
            return
        outdated = [n for n in self._live(name) if self._label(n, "pod-template-hash") != stamp]
        if outdated and (dep["spec"].get("minReadySeconds") or 0) > 0:
            self._held_roll(dep, stamp, want, outdated)
            return
        for old in outdated:
            self.delete_pod(old)
        live = self._live(name)
        ranked = sorted(
            live,
            key=lambda n: (
                self._ready(n),
                int(self._note(n, v.ANNOTATION_DELETION_COST) or 0),
                -self._created(n),
                n,
            ),
        )
        for extra in ranked[: max(len(live) - want, 0)]:
            self.delete_pod(extra)
        for _ in range(want - len(live)):
            self._new_pod(dep, stamp)

    def _held_roll(
        self, dep: Obj, stamp: str, want: int, outdated: list[str], ready: bool = False
    ) -> None:
        """A rolling update whose new pods never become available (a long minReadySeconds):
        the old pods go down to `want - maxUnavailable` (unready first), and new pods come up to
        `want + maxSurge` pods in all, and no further."""
        name = dep["metadata"]["name"]
        rolling = (dep["spec"].get("strategy") or {}).get("rollingUpdate") or {}
        surge, unavailable = int(rolling.get("maxSurge", 1)), int(rolling.get("maxUnavailable", 0))
        keep = max(want - unavailable, 0)
        for pod in sorted(outdated, key=lambda n: (self._ready(n), -self._created(n), n))[
            : max(len(outdated) - keep, 0)
        ]:
            self.delete_pod(pod)
        live = self._live(name)
        current = [n for n in live if self._label(n, "pod-template-hash") == stamp]
        for _ in range(max(min(want + surge - len(live), want - len(current)), 0)):
            self._new_pod(dep, stamp, ready)

    def _roll_router(self, dep: Obj, stamp: str, want: int) -> None:
        """The router Deployment's rolling update (maxSurge 1, maxUnavailable 0): an outdated
        pod goes once the others keep `want` Ready; new pods come up to one beyond `want`."""
        name = dep["metadata"]["name"]
        if want == 0:
            for pod in self._live(name):
                self.delete_pod(pod)
            return
        ready = sum(self._ready(n) for n in self._live(name))
        for pod in sorted(self._live(name), key=self._ready):
            if self._label(pod, "pod-template-hash") == stamp:
                continue
            if not self._ready(pod) or ready - 1 >= want:
                ready -= self._ready(pod)
                self.delete_pod(pod)
        live = self._live(name)
        current = [n for n in live if self._label(n, "pod-template-hash") == stamp]
        if len(current) == len(live):
            for pod in sorted(current, key=self._ready)[: max(len(current) - want, 0)]:
                self.delete_pod(pod)
        for _ in range(max(min(want + 1 - len(live), want - len(current)), 0)):
            self._new_pod(dep, stamp)

    def _new_pod(self, dep: Obj, stamp: str, ready: bool = False) -> None:
        """A pod of `dep` at the lowest free index (pod names stay those the golden statuses
        recorded); simulating, it also gets a node and a creation time, and a unique uid."""
        name = dep["metadata"]["name"]
        template = dep["spec"]["template"]
        index = next(i for i in range(len(self.pods) + 1) if f"{name}-{i}" not in self.pods)
        if self.unique_names:
            index = self.next_ip
        pod_name = f"{name}-{index}"
        metadata = {
            "name": pod_name,
            "namespace": dep["metadata"]["namespace"],
            "labels": {**template["metadata"]["labels"], "pod-template-hash": stamp},
            "annotations": dict(template["metadata"].get("annotations") or {}),
            "uid": f"uid-{pod_name}",
        }
        spec = copy.deepcopy(template["spec"])
        if self.simulating:
            metadata["uid"] = f"uid-{pod_name}-{self.next_ip}"
            metadata["creationTimestamp"] = self._stamp()
            spec["nodeName"] = f"node-{self.next_ip}"
        self.pods[pod_name] = {
            "kind": "Pod",
            "metadata": metadata,
            "spec": spec,
            "status": {
                "phase": "Running",
                "podIP": self._ip(),
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            },
        }
        self.next_ip += 1

    def pods_named(self, deployment: str) -> list[str]:
        return [n for n in self.pods if n.rsplit("-", 1)[0] == deployment]

    def _label(self, pod: str, key: str) -> str | None:
        labels: dict[str, str] = self.pods[pod]["metadata"].get("labels") or {}
        return labels.get(key)

    def _note(self, pod: str, key: str) -> str | None:
        notes: dict[str, str] = self.pods[pod]["metadata"].get("annotations") or {}
        return notes.get(key)

    def pods_of(self, deployment_suffix: str) -> list[Obj]:
        return [
            p
            for n, p in sorted(self.pods.items())
            if n.rsplit("-", 1)[0].endswith(deployment_suffix)
        ]

"""An in-memory stand-in for the API server and the Deployment controller, for unit tests of the
pure reconcile: it applies a decision's actions, makes pods for Deployments, and hands back what
the shell would observe. Nothing here is asserted on; tests assert on the decisions."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from pdmtp.api import vocabulary as v
from pdmtp.core.actions import Annotate, Apply, Delete, Scale
from pdmtp.core.hashing import short_hash
from pdmtp.core.reconcile import Decision, Observed, decide

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
            workload_api=self.workload_api,
        )

    def reconcile(self, now: float) -> Decision:
        """One decide, its actions applied and its status stored, as the shell would."""
        decision = decide(self.observed(), now)
        self.apply(decision)
        if decision.status_changed:
            self.body["status"] = copy.deepcopy(decision.status)
        return decision

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
                pod["metadata"]["creationTimestamp"] = CREATED
                pod["metadata"]["uid"] = f"uid-{pod['metadata']['name']}"
                pod["status"] = {"phase": "Pending"}
                self.pods.setdefault(pod["metadata"]["name"], pod)
            elif isinstance(action, Apply):
                manifest = copy.deepcopy(action.manifest)
                old = self.objects.get(action.key)
                created = (old or {}).get("metadata", {}).get("creationTimestamp", CREATED)
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
                self.pods.pop(action.name, None)
            elif isinstance(action, Delete) and action.kind == v.POD_GROUP_KIND:
                self.objects.pop(action.key, None)
            elif isinstance(action, Delete):
                self.objects.pop(f"{action.kind}/{action.name}", None)
                for name in [n for n in self.pods if n.startswith(action.name + "-")]:
                    del self.pods[name]

    def run_pods(self, ready: bool = True) -> None:
        """The Deployment controller and kubelet: every Deployment gets exactly its replicas,
        the lowest deletion cost deleted first, and a pod of an older template is replaced."""
        for key, dep in self.objects.items():
            if not key.startswith("Deployment/"):
                continue
            name = dep["metadata"]["name"]
            template = dep["spec"]["template"]
            stamp = short_hash(template, 10)
            mine = [n for n in self.pods if n.rsplit("-", 1)[0] == name]
            for old in [n for n in mine if self._label(n, "pod-template-hash") != stamp]:
                del self.pods[old]
            mine = sorted(
                (n for n in self.pods if n.rsplit("-", 1)[0] == name),
                key=lambda n: (int(self._note(n, v.ANNOTATION_DELETION_COST) or 0), n),
            )
            want = dep["spec"]["replicas"]
            for extra in mine[: max(len(mine) - want, 0)]:
                del self.pods[extra]
            for _ in range(want - len(self.pods_named(name))):
                # The lowest free index: pod names stay those the golden statuses recorded.
                index = next(i for i in range(len(self.pods) + 1) if f"{name}-{i}" not in self.pods)
                pod_name = f"{name}-{index}"
                self.pods[pod_name] = {
                    "kind": "Pod",
                    "metadata": {
                        "name": pod_name,
                        "namespace": dep["metadata"]["namespace"],
                        "labels": {**template["metadata"]["labels"], "pod-template-hash": stamp},
                        "annotations": dict(template["metadata"].get("annotations") or {}),
                        "uid": f"uid-{pod_name}",
                    },
                    "spec": copy.deepcopy(template["spec"]),
                    "status": {
                        "phase": "Running",
                        "podIP": f"192.0.2.{self.next_ip}",
                        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                    },
                }
                self.next_ip += 1

    def place_groups(self, ready: bool = True) -> None:
        """The gang scheduler and the kubelets for multi-node groups: a PodGroup's pods are
        bound all at once, when all `minCount` exist, and then run (Ready if `ready`)."""
        for key, group in self.objects.items():
            if not key.startswith(f"{v.POD_GROUP_KIND}/"):
                continue
            name = group["metadata"]["name"]
            members = [
                p
                for p in self.pods.values()
                if (p["spec"].get("schedulingGroup") or {}).get("podGroupName") == name
            ]
            if len(members) < group["spec"]["schedulingPolicy"]["gang"]["minCount"]:
                continue
            for pod in members:
                if pod["spec"].get("nodeName"):
                    continue
                pod["spec"]["nodeName"] = f"node-{self.next_ip}"
                pod["status"] = {
                    "phase": "Running",
                    "podIP": f"192.0.2.{self.next_ip}",
                    "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
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

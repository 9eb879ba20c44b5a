"""An in-memory stand-in for the API server and the Deployment controller, for unit tests of the
pure reconcile: it applies a decision's actions, makes pods for Deployments, and hands back what
the shell would observe. Nothing here is asserted on; tests assert on the decisions."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from pdmtp.core.actions import Apply, Delete, Scale
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

    def observed(self) -> Observed:
        deployments = [o for k, o in self.objects.items() if k.startswith("Deployment/")]
        others = [o for k, o in self.objects.items() if not k.startswith("Deployment/")]
        return Observed(copy.deepcopy(self.body), deployments, list(self.pods.values()), others)

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
            if isinstance(action, Apply):
                manifest = copy.deepcopy(action.manifest)
                old = self.objects.get(action.key)
                created = (old or {}).get("metadata", {}).get("creationTimestamp", CREATED)
                manifest["metadata"]["creationTimestamp"] = created
                self.objects[action.key] = manifest
            elif isinstance(action, Scale):
                self.objects[f"Deployment/{action.name}"]["spec"]["replicas"] = action.replicas
            elif isinstance(action, Delete):
                self.objects.pop(f"{action.kind}/{action.name}", None)
                for name in [n for n in self.pods if n.startswith(action.name + "-")]:
                    del self.pods[name]

    def run_pods(self, ready: bool = True) -> None:
        """The Deployment controller and kubelet: every Deployment gets exactly its replicas."""
        for key, dep in self.objects.items():
            if not key.startswith("Deployment/"):
                continue
            name = dep["metadata"]["name"]
            mine = sorted(n for n in self.pods if n.rsplit("-", 1)[0] == name)
            want = dep["spec"]["replicas"]
            for extra in mine[want:]:
                del self.pods[extra]
            template = dep["spec"]["template"]["metadata"]
            for i in range(want):
                pod_name = f"{name}-{i}"
                if pod_name in self.pods:
                    continue
                self.pods[pod_name] = {
                    "kind": "Pod",
                    "metadata": {
                        "name": pod_name,
                        "namespace": dep["metadata"]["namespace"],
                        "labels": dict(template["labels"]),
                        "annotations": dict(template.get("annotations") or {}),
                        "uid": f"uid-{pod_name}",
                    },
                    "status": {
                        "phase": "Running",
                        "podIP": f"192.0.2.{self.next_ip}",
                        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                    },
                }
                self.next_ip += 1

    def pods_of(self, deployment_suffix: str) -> list[Obj]:
        return [
            p
            for n, p in sorted(self.pods.items())
            if n.rsplit("-", 1)[0].endswith(deployment_suffix)
        ]

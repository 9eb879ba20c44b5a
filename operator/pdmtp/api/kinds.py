"""Every kind of object the operator touches, once: where it lives in the API, whether the child
cache watches it, and what the operator's identity does with it.

The API paths (`pdmtp.kube`), the reflectors (`pdmtp.cache`), the observation handed to the core
(`pdmtp.controller`) and the RBAC rules `deploy/operator/rbac.yaml` must grant (a unit test
compares them) all read this table, so a kind added here is paths, cache, observation and a
failing RBAC test at once. Pure data: no Kubernetes client, no kopf.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal
from urllib.parse import quote

from pdmtp.api import vocabulary as v

Verb = Literal["get", "list", "watch", "create", "update", "patch", "delete"]
Grant = tuple[str, str, str]
"""One RBAC permission: (apiGroup, resource, verb)."""


@dataclass(frozen=True)
class Kind:
    kind: str
    group: str
    """Empty for the core group."""
    version: str
    plural: str
    verbs: frozenset[Verb]
    """What the operator's ServiceAccount does with it (the CLI runs as its user, not here)."""
    namespaced: bool = True
    watched: bool = False
    """Listed and watched into the child cache (objects labelled managed-by pdmtp)."""
    status_verbs: frozenset[Verb] = frozenset()
    """What it does with the status subresource."""
    home: bool = False
    """Lives in the operator's own namespace only (a Role there grants it, not the ClusterRole)."""
    optional: bool = False
    """Its CRD may be missing (an install that predates it): the cache then holds none of it
    rather than wait for it, and writing one is refused (reported in status)."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None, name: str | None = None, subresource: str = "") -> str:
        """The REST path; namespace None is the cluster-wide collection."""
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if namespace is not None and self.namespaced:
            prefix += f"/namespaces/{quote(namespace)}"
        p = f"{prefix}/{self.plural}"
        if name is not None:
            p += f"/{quote(name)}"
        return p + (f"/{subresource}" if subresource else "")

    def grants(self) -> frozenset[Grant]:
        own = {(self.group, self.plural, verb) for verb in self.verbs}
        status = {(self.group, f"{self.plural}/status", verb) for verb in self.status_verbs}
        return frozenset(own | status)


def _verbs(*verbs: Verb) -> frozenset[Verb]:
    return frozenset(verbs)


READ = _verbs("list", "watch")
APPLY = _verbs("list", "watch", "create", "patch")  # server-side apply creates or updates
OWN = APPLY | _verbs("delete")

# Watched kinds first, in the order the reflectors start.
DEPLOYMENT: Final = Kind("Deployment", "apps", "v1", "deployments", OWN, watched=True)
"""Per-revision workloads: applied, scaled (a patch), retired."""
POD: Final = Kind("Pod", "", "v1", "pods", OWN, watched=True)
"""Engine and router pods: readiness, IPs for the router, termination messages; patched to mark
an engine pod leaving routing before a scale-down removes it (`core.rollout.removal`); created and
deleted only as members of a multi-node group (`core.groups`: no built-in workload keeps a group
whole)."""
# Shared children (the client Service, the routers' ServiceAccount, the NetworkPolicy): watched
# so a deleted or edited one is restored; never deleted (the owner reference garbage-collects).
# The one exception: a multi-node role's headless Service goes with its retired revision.
SERVICE: Final = Kind("Service", "", "v1", "services", OWN, watched=True)
SERVICE_ACCOUNT: Final = Kind("ServiceAccount", "", "v1", "serviceaccounts", APPLY, watched=True)
NETWORK_POLICY: Final = Kind(
    "NetworkPolicy", "networking.k8s.io", "v1", "networkpolicies", APPLY, watched=True
)
CONTROLLER_REVISION: Final = Kind(
    "ControllerRevision", "apps", "v1", "controllerrevisions", OWN, watched=True
)
"""Revision history (`pdmtp rollout undo`): one per spec, pruned to the limit."""
ROLE_SCALE: Final = Kind(
    v.ROLE_SCALE_KIND,
    v.GROUP,
    v.VERSION,
    v.ROLE_SCALE_PLURAL,
    OWN,
    watched=True,
    status_verbs=_verbs("patch"),
    optional=True,
)
"""An External-autoscaled role's scale endpoint: created once (its spec.replicas is then the
HPA's), status written, deleted when the role stops being External."""
POD_GROUP: Final = Kind(
    v.POD_GROUP_KIND,
    v.WORKLOAD_API_GROUP,
    v.WORKLOAD_API_VERSIONS[0],
    v.POD_GROUP_PLURAL,
    OWN,
    watched=True,
    optional=True,
)
"""A multi-node group's gang (the Workload API): created with its pods, deleted with them. The
version is the newest the API server serves (`controller` discovers it); a cluster without the
API holds none."""
DISRUPTION_BUDGET: Final = Kind(
    v.DISRUPTION_BUDGET_KIND, "policy", "v1", "poddisruptionbudgets", OWN, watched=True
)
"""A (revision, engine role)'s PodDisruptionBudget (`core.render.budgets`): applied, watched so an
edited or deleted one is restored, deleted with its revision."""
NODE: Final = Kind("Node", "", "v1", "nodes", READ, namespaced=False)
"""Nodes, listed and watched (every one) for cordons: a drain's engine pods are moved off first
(`core.rollout.evacuation`)."""
EVENT: Final = Kind("Event", "", "v1", "events", _verbs("create"))
"""Events about PDDeployments, posted only."""
LEASE: Final = Kind(
    "Lease", "coordination.k8s.io", "v1", "leases", _verbs("get", "create", "update"), home=True
)
"""The leader election's Lease (`pdmtp.election`): read, created once, renewed by replacing it
over its resourceVersion; in the operator's own namespace."""
PDDEPLOYMENT: Final = Kind(v.KIND, v.GROUP, v.VERSION, v.PLURAL, READ, status_verbs=_verbs("patch"))
"""The objects it reconciles: every one listed and watched by reflectors of their own (not the
labelled child cache), status written back."""

KINDS: Final = (
    DEPLOYMENT,
    POD,
    SERVICE,
    SERVICE_ACCOUNT,
    NETWORK_POLICY,
    CONTROLLER_REVISION,
    ROLE_SCALE,
    POD_GROUP,
    DISRUPTION_BUDGET,
    NODE,
    EVENT,
    LEASE,
    PDDEPLOYMENT,
)
WATCHED: Final = tuple(k for k in KINDS if k.watched)
BY_KIND: Final = {k.kind: k for k in KINDS}

# kopf's own needs: discovering the resource its webhook admits, and the namespaces it serves.
KOPF: Final = (
    Kind(
        "CustomResourceDefinition",
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        READ,
        namespaced=False,
    ),
    Kind("Namespace", "", "v1", "namespaces", READ, namespaced=False),
)

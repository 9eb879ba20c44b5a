"""Deterministic names and labels of every child object: computed, never stored."""

from typing import Any

from pdmtp.api import vocabulary as v
from pdmtp.api.v1alpha1 import PDDeployment
from pdmtp.api.vocabulary import Role


def workload(name: str, revision: str, role: Role) -> str:
    """The Deployment of one (revision, role): `<name>-<revision>-<role>`."""
    return f"{name}-{revision}-{role}"


def disruption_budget(name: str, revision: str, role: Role) -> str:
    """The PodDisruptionBudget of one (revision, engine role): its workload's name."""
    return workload(name, revision, role)


def group(name: str, revision: str, role: Role, group_id: str) -> str:
    """The PodGroup of one multi-node replica: `<name>-<revision>-<role>-<group id>`."""
    return f"{workload(name, revision, role)}-{group_id}"


def group_pod(name: str, revision: str, role: Role, group_id: str, rank: int) -> str:
    """A multi-node replica's pod: `<name>-<revision>-<role>-<group id>-<rank>`."""
    return f"{group(name, revision, role, group_id)}-{rank}"


def group_hostname(group_id: str, rank: int) -> str:
    """A group pod's hostname under its role's headless Service (a DNS label at any length)."""
    return f"{group_id}-{rank}"


def group_id(number: int) -> str:
    return f"g{number}"


def owner_reference(pdd: PDDeployment) -> dict[str, Any]:
    """The controller owner reference to a PDDeployment: the garbage collector removes children
    with their owner."""
    return {
        "apiVersion": v.API_VERSION,
        "kind": v.KIND,
        "name": pdd.metadata.name,
        "uid": pdd.metadata.uid or "",
        "controller": True,
        "blockOwnerDeletion": True,
    }


def client_service(name: str) -> str:
    """The Service clients send requests to (it selects the serving routers)."""
    return name


def network_policy(name: str) -> str:
    """The NetworkPolicy that lets P and D pods reach each other on any TCP port."""
    return f"{name}-pd"


def router_account(name: str) -> str:
    """ServiceAccount, Role and RoleBinding of the routers (pod discovery only)."""
    return f"{name}-router"


def role_scale(name: str, role: Role) -> str:
    """The PDRoleScale of an External-autoscaled role: `<name>-<role>` (what an HPA targets)."""
    return f"{name}-{role}"


def role_selector(name: str, role: Role) -> str:
    """The label selector of a role's pods across revisions (a PDRoleScale's status)."""
    return f"{v.LABEL_NAME}={name},{v.LABEL_ROLE}={role}"


def base_labels(name: str) -> dict[str, str]:
    """Labels every child carries: enough to list all of a PDDeployment's objects."""
    return {v.LABEL_NAME: name, v.LABEL_MANAGED_BY: v.MANAGED_BY}


def selector(name: str, revision: str, role: Role) -> dict[str, str]:
    """Pod selector of one (revision, role) workload."""
    return {v.LABEL_NAME: name, v.LABEL_ROLE: role, v.LABEL_REVISION: revision}


def pod_labels(name: str, revision: str, role: Role) -> dict[str, str]:
    """Labels of the pods of one (revision, role)."""
    return {**base_labels(name), **selector(name, revision, role)}


def group_labels(name: str, revision: str, role: Role, group_id: str) -> dict[str, str]:
    """Labels of a multi-node replica's PodGroup (its pods add their rank)."""
    return {**pod_labels(name, revision, role), v.LABEL_GROUP: group_id}

"""Revision hashing: what triggers a paired rollout, what rolls one role, what rolls nothing.

The compat revision covers every setting both roles must agree on (docs/design.md, "What both
roles must agree on"); a change to it starts a paired rollout to a new revision. The role hash
covers a role's local settings; a change to it rolls that role's pods inside the revision.
Replicas are in neither: scaling is not a rollout.
"""

from __future__ import annotations

from typing import Any

from pdmtp.api.v1alpha1 import PDDeploymentSpec, RoleSpec
from pdmtp.api.vocabulary import ENGINE_ROLES, Role
from pdmtp.core.agreement import Agreement, role_max_model_len, speculative_tokens
from pdmtp.core.hashing import short_hash
from pdmtp.core.planner import Policy, Target

REVISION_LENGTH = 8


def _digest(data: Any) -> str:
    return short_hash(data, REVISION_LENGTH)


def compat_settings(spec: PDDeploymentSpec) -> dict[str, Any]:
    """The cross-role settings, canonically: the input of the compat revision."""
    roles = {}
    for name in ENGINE_ROLES:
        role = spec.role(name)
        roles[name] = {
            "numSpeculativeTokens": speculative_tokens(spec, role),
            "tensorParallelSize": role.tensor_parallel_size,
            "pipelineParallelSize": role.pipeline_parallel_size,
            "maxModelLen": role_max_model_len(spec, role),
        }
    return {
        "image": spec.image,
        "model": spec.model.model_dump(by_alias=True, mode="json"),
        "engine": spec.engine.model_dump(by_alias=True, mode="json"),
        "speculative": (
            None
            if spec.speculative is None
            else spec.speculative.model_dump(by_alias=True, mode="json")
        ),
        "kvTransfer": spec.kv_transfer.model_dump(by_alias=True, mode="json"),
        "roles": roles,
    }


def compat_revision(spec: PDDeploymentSpec) -> str:
    """Short hash of the cross-role settings; names the workloads of a revision."""
    return _digest(compat_settings(spec))


def role_settings(role: RoleSpec) -> dict[str, Any]:
    """A role's local settings: resources, placement, env, annotations, its extraArgs."""
    return role.model_dump(
        by_alias=True,
        mode="json",
        include={
            "resources",
            "extra_args",
            "env",
            "node_selector",
            "tolerations",
            "pod_annotations",
        },
    )


def role_hash(spec: PDDeploymentSpec, role: Role) -> str:
    """Short hash of one role's local settings (the router's: image and policy)."""
    if role == "router":
        return _digest(spec.router.model_dump(by_alias=True, mode="json", exclude={"replicas"}))
    return _digest(role_settings(spec.role(role)))


def target_and_policy(spec: PDDeploymentSpec, agreement: Agreement) -> tuple[Target, Policy]:
    """What the planner aims for and the rules it keeps; no target revision when incompatible."""
    revision = compat_revision(spec) if agreement.compatible else None
    target = Target(revision, spec.prefill.replicas, spec.decode.replicas, spec.router.replicas)
    rollout = spec.rollout
    return target, Policy(rollout.max_surge, rollout.max_unavailable, rollout.drain_seconds)

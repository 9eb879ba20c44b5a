"""Revision hashing: what triggers a paired rollout, what rolls one role, what rolls nothing.

The compat revision covers every setting both roles must agree on (DESIGN.md section 4); a change
to it starts a paired rollout to a new revision. The role hash covers a role's local settings; a
change to it rolls that role's pods inside the revision. Replicas are in neither: scaling is not a
rollout.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pdmtp.api.v1alpha1 import PDDeploymentSpec, RoleSpec
from pdmtp.core.agreement import role_max_model_len, speculative_tokens
from pdmtp.core.vocabulary import Role

REVISION_LENGTH = 8


def _digest(data: Any) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:REVISION_LENGTH]


def compat_settings(spec: PDDeploymentSpec) -> dict[str, Any]:
    """The cross-role settings, canonically: the input of the compat revision."""
    roles = {}
    for name, role in (("prefill", spec.prefill), ("decode", spec.decode)):
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
    return _digest(role_settings(spec.prefill if role == "prefill" else spec.decode))

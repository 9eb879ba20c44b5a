"""Revision hashing: what triggers a paired rollout, what rolls one role, what rolls nothing.

Hashes are stable across operator versions: a field added to the API enters a hash only when it
is set, so upgrading the operator never rolls a PDDeployment that does not use the new field
(tests/unit/test_revision.py holds hashes recorded before such fields existed).

The compat revision covers every setting both roles must agree on (docs/design.md, "What both
roles must agree on"); a change to it starts a paired rollout to a new revision. The role hash
covers a role's local settings; a change to it rolls that role's pods inside the revision.
Replicas are in neither: scaling is not a rollout.
"""

from __future__ import annotations

from typing import Any

from pdmtp.api.pod import PodSettings
from pdmtp.api.v1alpha1 import PDDeploymentSpec
from pdmtp.api.vocabulary import ENGINE_ROLES, EngineRole, Role
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
    model = spec.model.model_dump(by_alias=True, mode="json", exclude={"source"})
    if spec.model.source is not None:
        # The weights both roles load (invariant: the same source and revision).
        model["source"] = spec.model.source.model_dump(
            by_alias=True, mode="json", exclude_none=True
        )
    return {
        "image": spec.image,
        "model": model,
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


def role_settings(spec: PDDeploymentSpec, name: EngineRole) -> dict[str, Any]:
    """A role's local settings: resources, placement, env, annotations, its extraArgs, its pod
    settings (spec.pod under the role's own) and RDMA devices where the role overrides them."""
    role = spec.role(name)
    settings = role.model_dump(
        by_alias=True,
        mode="json",
        include={"resources", "extra_args", "node_selector", "tolerations", "pod_annotations"},
    )
    # As first hashed: a literal value, "" when unset.
    settings["env"] = [
        {"name": e.name, "value": e.value or ""}
        if e.value_from is None
        else e.model_dump(by_alias=True, mode="json", exclude_none=True)
        for e in role.env
    ]
    later = {
        "envFrom": [
            e.model_dump(by_alias=True, mode="json", exclude_none=True) for e in role.env_from
        ],
        "pod": effective_pod(spec, name).model_dump(by_alias=True, mode="json", exclude_none=True),
        "deviceNames": role.kv_transfer.device_names if role.kv_transfer else None,
        "placement": (
            spec.placement.model_dump(by_alias=True, mode="json", exclude_none=True)
            if spec.placement
            else None
        ),
    }
    settings.update({k: val for k, val in later.items() if val})
    return settings


def effective_pod(spec: PDDeploymentSpec, name: EngineRole) -> PodSettings:
    """A role's pod settings: spec.pod, with every field the role sets replacing it."""
    own = spec.role(name).pod
    if own is not None:
        return own.over(spec.pod)
    return spec.pod if spec.pod is not None else PodSettings()


def role_hash(spec: PDDeploymentSpec, role: Role) -> str:
    """Short hash of one role's local settings (the router's: image and policy)."""
    if role == "router":
        return _digest(spec.router.model_dump(by_alias=True, mode="json", exclude={"replicas"}))
    return _digest(role_settings(spec, role))


def target_and_policy(spec: PDDeploymentSpec, agreement: Agreement) -> tuple[Target, Policy]:
    """What the planner aims for and the rules it keeps; no target revision when incompatible."""
    revision = compat_revision(spec) if agreement.compatible else None
    target = Target(revision, spec.prefill.replicas, spec.decode.replicas, spec.router.replicas)
    rollout = spec.rollout
    return target, Policy(rollout.max_surge, rollout.max_unavailable, rollout.drain_seconds)

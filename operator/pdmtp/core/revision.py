"""Revision hashing over the resolved settings (`effective`): the compat revision (a change starts a
paired rollout) and each role's hash (a change rolls that role inside its revision). The unhashed
group is in neither: scaling and the rollout policy are not rollouts.

Hashes are stable across operator versions: a field added to the API enters a hash only when it
is set, so upgrading the operator never rolls a PDDeployment that does not use the new field
(tests/unit/test_revision.py holds hashes recorded before such fields existed). The dictionaries
below therefore keep the shape they were first hashed with.
"""

from __future__ import annotations

from typing import Any

from pdmtp.api.v1alpha1 import PDDeploymentSpec
from pdmtp.api.vocabulary import EngineRole, Role
from pdmtp.core.effective import Effective, EngineRoleSettings, resolve
from pdmtp.core.hashing import short_hash

REVISION_LENGTH = 8


def _digest(data: Any) -> str:
    return short_hash(data, REVISION_LENGTH)


def _dump(model: Any, **options: Any) -> Any:
    return model.model_dump(by_alias=True, mode="json", **options)


def compat_settings(eff: Effective) -> dict[str, Any]:
    """The compat group, canonically: the input of the compat revision."""
    shared = eff.shared
    model = _dump(shared.model, exclude={"source"})
    if shared.model.source is not None:
        # The weights both roles load (invariant: the same source and revision).
        model["source"] = _dump(shared.model.source, exclude_none=True)
    roles: dict[str, dict[str, Any]] = {
        r.name: {
            "numSpeculativeTokens": r.compat.num_speculative_tokens,
            "tensorParallelSize": r.compat.tensor_parallel_size,
            "pipelineParallelSize": r.compat.pipeline_parallel_size,
            "maxModelLen": r.compat.max_model_len,
        }
        for r in eff.roles
    }
    for r in eff.roles:
        if r.compat.multi_node is not None:  # hashed only when set (see the module docstring)
            # A group is never rolled in place (its ranks cannot rejoin a running engine): any
            # change to a multi-node role, local settings included, is a new revision.
            roles[r.name]["multiNode"] = _dump(r.compat.multi_node, exclude_none=True)
            roles[r.name]["local"] = role_settings(r)
    return {
        "image": shared.image,
        "model": model,
        "engine": _dump(shared.engine),
        "speculative": None if shared.speculative is None else _dump(shared.speculative),
        # loadFailurePolicy is the decode's alone (`role_settings`).
        "kvTransfer": _dump(shared.kv_transfer, exclude={"load_failure_policy"}),
        "roles": roles,
    }


def role_settings(role: EngineRoleSettings) -> dict[str, Any]:
    """An engine role's local group, canonically: the input of its role hash."""
    local = role.local
    settings: dict[str, Any] = {
        "resources": _dump(local.resources),
        "extraArgs": list(local.extra_args),
        "nodeSelector": dict(local.node_selector),
        "tolerations": [_dump(t) for t in local.tolerations],
        "podAnnotations": dict(local.pod_annotations),
        # As first hashed: a literal value, "" when unset.
        "env": [
            {"name": e.name, "value": e.value or ""}
            if e.value_from is None
            else _dump(e, exclude_none=True)
            for e in local.env
        ],
    }
    # Hashed only when set (see the module docstring).
    later = {
        "envFrom": [_dump(e, exclude_none=True) for e in local.env_from],
        "pod": _dump(local.pod, exclude_none=True),
        "deviceNames": list(local.device_names) if local.devices_overridden else None,
        "placement": _dump(local.placement, exclude_none=True) if local.placement else None,
        "loadFailurePolicy": local.load_failure_policy,
    }
    settings.update({k: val for k, val in later.items() if val})
    return settings


def revision_of(eff: Effective) -> str:
    """Short hash of the compat group; names the workloads of a revision."""
    return _digest(compat_settings(eff))


def hash_of(eff: Effective, role: Role) -> str:
    """Short hash of one role's local group (the router's: image and policy)."""
    if role == "router":
        router: dict[str, Any] = {"image": eff.router.image, "policy": eff.router.policy}
        if eff.router.resources is not None:  # hashed only when set
            router["resources"] = _dump(eff.router.resources)
        return _digest(router)
    return _digest(role_settings(eff.role(role)))


def role_hash(spec: PDDeploymentSpec, role: Role | EngineRole) -> str:
    """`hash_of` a spec's role."""
    return hash_of(resolve(spec), role)

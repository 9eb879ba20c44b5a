"""The spec resolved once: what each role runs with, sorted by what a change to it does.

`resolve(spec)` works out every effective setting (a role's override over the shared value, the
role's pod settings over spec.pod, its RDMA devices) in one place and files it in one of three
groups:

- **compat**: what both roles must agree on; the input of the compat revision, so a change starts
  a paired rollout (`Shared`, and each role's `EngineCompat`);
- **role-local**: what one role may set for itself; the input of that role's hash, so a change
  rolls that role's pods inside the revision (`RoleLocal`, the router's image and policy);
- **unhashed**: what rolls nothing: replicas and autoscaling (scaling is not a rollout), the
  rollout policy, the history limit. None of it may reach a pod template.

`FIELD_GROUPS` says which group every field of the spec belongs to; tests/unit/test_effective.py
fails for a field that is in no group, and checks by mutation that each group behaves as said.
Agreement, hashing, rendering, weights and scheduling read the resolved settings, never the spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pdmtp.api.multinode import MultiNodeSpec
from pdmtp.api.pod import EnvFromSource, EnvVar, Placement, PodSettings, ResourceRequirements
from pdmtp.api.pod import Toleration as TolerationSpec
from pdmtp.api.v1alpha1 import (
    EngineSpec,
    KVTransferSpec,
    ModelSpec,
    PDDeploymentSpec,
    RoleSpec,
    RolloutSpec,
    SpeculativeSpec,
)
from pdmtp.api.vocabulary import ENGINE_ROLES, EngineRole, by_role

FieldGroup = Literal["compat", "role", "unhashed"]

# Every field of PDDeploymentSpec, by wire path; `<role>` stands for prefill and decode. A path
# names a whole subtree (the walk in the test stops there): k8s-shaped values (env, resources,
# pod settings) and the weights source are classified whole, our own structures field by field.
FIELD_GROUPS: Mapping[str, FieldGroup] = {
    "image": "compat",
    "model.name": "compat",
    "model.revision": "compat",
    "model.mtpModules": "compat",
    "model.quantization": "compat",
    "model.source": "compat",
    "engine.dtype": "compat",
    "engine.kvCacheDtype": "compat",
    "engine.blockSize": "compat",
    "engine.maxModelLen": "compat",
    "engine.attentionBackend": "compat",
    "engine.disableHybridKVCacheManager": "compat",
    "engine.stateBackoff": "compat",
    "engine.extraArgs": "compat",
    "speculative.method": "compat",
    "speculative.numSpeculativeTokens": "compat",
    "speculative.draftModel": "compat",
    "kvTransfer.protocol": "compat",
    "kvTransfer.deviceNames": "compat",
    "kvTransfer.bootstrapPort": "compat",
    "kvTransfer.loadFailurePolicy": "role",
    "<role>.replicas": "unhashed",
    "<role>.tensorParallelSize": "compat",
    "<role>.pipelineParallelSize": "compat",
    "<role>.maxModelLen": "compat",
    "<role>.multiNode": "compat",
    "<role>.speculative.numSpeculativeTokens": "compat",
    "<role>.resources": "role",
    "<role>.extraArgs": "role",
    "<role>.env": "role",
    "<role>.envFrom": "role",
    "<role>.nodeSelector": "role",
    "<role>.tolerations": "role",
    "<role>.podAnnotations": "role",
    "<role>.pod": "role",
    "<role>.kvTransfer.deviceNames": "role",
    "pod": "role",
    "placement": "role",
    "router.replicas": "unhashed",
    "router.policy": "role",
    "router.image": "role",
    "router.resources": "role",
    "rollout": "unhashed",
    "autoscaling": "unhashed",
    "verification": "unhashed",
    "revisionHistoryLimit": "unhashed",
}
"""`rollout` is unhashed whole, drainSeconds included: it times the operator's drain of a retiring
revision and reaches no pod (an engine pod's own grace period is role-local:
`pod.terminationGracePeriodSeconds`). `kvTransfer.loadFailurePolicy` is role-local although it sits
with the compat transfer settings: only the decode loads KV, so the prefill need not agree with it,
and a change rolls the decodes alone (docs/design.md, "Revisions")."""


@dataclass(frozen=True)
class Shared:
    """Compat settings both roles run with, verbatim from the spec."""

    image: str
    model: ModelSpec
    engine: EngineSpec
    speculative: SpeculativeSpec | None
    kv_transfer: KVTransferSpec


@dataclass(frozen=True)
class EngineCompat:
    """A role's part of the compat revision: what may differ between roles only within the
    agreement's rules (k with an equal lookahead, divisible TP sizes, decode context >= prefill)."""

    num_speculative_tokens: int | None
    """Its override, else the shared k; None without speculation."""
    tensor_parallel_size: int
    pipeline_parallel_size: int
    max_model_len: int | None
    """Its override, else spec.engine.maxModelLen; None lets vLLM decide."""
    speculative_override: bool
    """The role sets its own k (an override without spec.speculative is a finding)."""
    multi_node: MultiNodeSpec | None = None
    """One replica spans several nodes (a group of pods). Compat whole: a group is never rolled
    in place, so with it set the role's local settings join the compat revision too."""


@dataclass(frozen=True)
class RoleLocal:
    """A role's local settings: a change rolls that role alone."""

    resources: ResourceRequirements
    extra_args: tuple[str, ...]
    env: tuple[EnvVar, ...]
    env_from: tuple[EnvFromSource, ...]
    node_selector: Mapping[str, str]
    tolerations: tuple[TolerationSpec, ...]
    pod_annotations: Mapping[str, str]
    pod: PodSettings
    """spec.pod with every field the role sets replacing it."""
    placement: Placement | None
    device_names: tuple[str, ...]
    """The RDMA devices the role names: its own, else spec.kvTransfer.deviceNames."""
    devices_overridden: bool
    """The role names its own devices (only then are they role-local; the shared list is compat)."""
    load_failure_policy: str | None = None
    """What the role's engine does with a KV load that fails (the decode's alone: a prefill loads
    none); None leaves vLLM's default."""


@dataclass(frozen=True)
class EngineRoleSettings:
    """Everything one engine role runs with."""

    name: EngineRole
    compat: EngineCompat
    local: RoleLocal
    replicas: int


@dataclass(frozen=True)
class RouterSettings:
    image: str
    policy: str
    replicas: int
    resources: ResourceRequirements | None


@dataclass(frozen=True)
class Effective:
    """A spec resolved: the shared compat settings, each role's, the router's, and the rest."""

    shared: Shared
    prefill: EngineRoleSettings
    decode: EngineRoleSettings
    router: RouterSettings
    rollout: RolloutSpec
    revision_history_limit: int

    def role(self, name: EngineRole) -> EngineRoleSettings:
        return by_role(name, self.prefill, self.decode)

    @property
    def roles(self) -> tuple[EngineRoleSettings, EngineRoleSettings]:
        return self.prefill, self.decode


def _speculative_tokens(spec: PDDeploymentSpec, role: RoleSpec) -> int | None:
    if spec.speculative is None:
        return None
    if role.speculative is not None:
        return role.speculative.num_speculative_tokens
    return spec.speculative.num_speculative_tokens


def _pod(spec: PDDeploymentSpec, role: RoleSpec) -> PodSettings:
    if role.pod is not None:
        return role.pod.over(spec.pod)
    return spec.pod if spec.pod is not None else PodSettings()


def _engine_role(spec: PDDeploymentSpec, name: EngineRole) -> EngineRoleSettings:
    role = spec.role(name)
    own_devices = role.kv_transfer.device_names if role.kv_transfer is not None else None
    compat = EngineCompat(
        num_speculative_tokens=_speculative_tokens(spec, role),
        tensor_parallel_size=role.tensor_parallel_size,
        pipeline_parallel_size=role.pipeline_parallel_size,
        max_model_len=(
            role.max_model_len if role.max_model_len is not None else spec.engine.max_model_len
        ),
        speculative_override=role.speculative is not None,
        multi_node=role.multi_node,
    )
    local = RoleLocal(
        resources=role.resources,
        extra_args=tuple(role.extra_args),
        env=tuple(role.env),
        env_from=tuple(role.env_from),
        node_selector=dict(role.node_selector),
        tolerations=tuple(role.tolerations),
        pod_annotations=dict(role.pod_annotations),
        pod=_pod(spec, role),
        placement=spec.placement,
        device_names=tuple(
            own_devices if own_devices is not None else spec.kv_transfer.device_names
        ),
        devices_overridden=own_devices is not None,
        load_failure_policy=spec.kv_transfer.load_failure_policy if name == "decode" else None,
    )
    return EngineRoleSettings(name, compat, local, role.replicas)


def resolve(spec: PDDeploymentSpec) -> Effective:
    """Every effective setting of `spec`, each worked out once."""
    prefill, decode = (_engine_role(spec, name) for name in ENGINE_ROLES)
    return Effective(
        shared=Shared(spec.image, spec.model, spec.engine, spec.speculative, spec.kv_transfer),
        prefill=prefill,
        decode=decode,
        router=RouterSettings(
            spec.router.image, spec.router.policy, spec.router.replicas, spec.router.resources
        ),
        rollout=spec.rollout,
        revision_history_limit=spec.revision_history_limit,
    )

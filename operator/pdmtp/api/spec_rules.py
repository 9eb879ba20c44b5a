"""The PDDeployment spec's validation rules, each a `Rule` (`pdmtp.api.rules`): its CEL (the API
server's check at admission, in the CRD) beside its Python check (`pdmtp validate`, the webhook,
the operator), with the one message both print. A rule that is a cross-role finding of the
agreement (`pdmtp.core.agreement`) names its reason instead of a Python check. `v1alpha1`
attaches them to its models.
"""

from __future__ import annotations

from typing import Any, Final

from pdmtp.api import reasons
from pdmtp.api import rules as r
from pdmtp.api import vocabulary as v
from pdmtp.api.flags import OWNED_FLAG_PATTERN, OWNED_FLAGS
from pdmtp.api.methods import DRAFT_MODEL_METHODS, MTP_METHOD_ALIASES
from pdmtp.api.multinode import MAX_GPUS_PER_POD, gpus_per_pod
from pdmtp.api.rules import Rule

_OWNED_FLAG_LIST = ", ".join(sorted({f for f in OWNED_FLAGS if f.startswith("--")}))


def _extra_args_rule(what: str) -> Rule:
    return Rule(
        f"self.all(a, !a.matches('{OWNED_FLAG_PATTERN}'))",
        f"{what} must not set flags owned by typed fields ({_OWNED_FLAG_LIST} and their short "
        "forms): set spec.model, spec.engine, spec.speculative, spec.kvTransfer or the role's "
        "tensorParallelSize/pipelineParallelSize/multiNode instead",
        finding=reasons.OWNED_FLAG_IN_EXTRA_ARGS,
    )


CREDENTIAL_FLAG: Final = r"(?i)^--?([a-z0-9]+[-_])*(token|key|secret|password)([-_][a-z0-9]+)*(=|$)"
"""A flag with a word TOKEN, KEY, SECRET or PASSWORD in its name (--api-key, --hf-token): the
words env's CREDENTIAL_NAME refuses literal values for; --max-num-batched-tokens has none."""


CREDENTIAL_ARG_RULE = Rule(
    f"!self.matches('{r.re2(CREDENTIAL_FLAG)}')",
    "extraArgs must not carry credentials: a flag whose name has the word TOKEN, KEY, SECRET or "
    "PASSWORD (--api-key, --hf-token) puts its value where anyone who can read the PDDeployment "
    "sees it: use spec.model.source.hub.tokenSecretRef for the hub token, or an env entry with "
    "valueFrom.secretKeyRef (VLLM_API_KEY for --api-key)",
    lambda arg: not r.found(CREDENTIAL_FLAG, arg),
)


ENGINE_EXTRA_ARGS_RULE = _extra_args_rule("spec.engine.extraArgs")


ROLE_EXTRA_ARGS_RULE = _extra_args_rule("a role's extraArgs")


_ENGINE_PORTS = (v.ENGINE_HTTP_PORT, v.ENGINE_METRICS_PORT)


BOOTSTRAP_PORT_RULE = Rule(
    " && ".join(f"self != {port}" for port in _ENGINE_PORTS),
    "spec.kvTransfer.bootstrapPort must differ from the engine's own ports "
    f"({v.ENGINE_HTTP_PORT} HTTP, {v.ENGINE_METRICS_PORT} metrics)",
    holds=lambda port: port not in _ENGINE_PORTS,
)


RDMA_DEVICES_RULE = Rule(
    "self.protocol != 'rdma' || size(self.deviceNames) > 0",
    "spec.kvTransfer.deviceNames must list the RDMA devices (e.g. [mlx5_0]) when "
    "spec.kvTransfer.protocol is rdma; use protocol tcp for clusters without RDMA",
    finding=reasons.RDMA_DEVICES_MISSING,
)


TP_SPLIT_RULE = Rule(
    "!has(self.multiNode) || self.multiNode.layout != 'TensorParallel' || "
    "(self.tensorParallelSize * self.pipelineParallelSize) % self.multiNode.nodes == 0",
    "spec.<role>.multiNode.nodes must divide the role's tensorParallelSize x "
    "pipelineParallelSize: a TensorParallel group splits those GPUs evenly over its nodes (vLLM: "
    "the world size must be divisible by --nnodes)",
    lambda role: (
        role.multi_node is None
        or gpus_per_pod(role.multi_node, role.tensor_parallel_size, role.pipeline_parallel_size)[1]
        == 0
    ),
)


GROUP_GPUS_RULE = Rule(
    "!has(self.multiNode) || !has(self.multiNode.dataParallelSize) || "
    "self.multiNode.dataParallelSize / self.multiNode.nodes * self.tensorParallelSize * "
    f"self.pipelineParallelSize <= {MAX_GPUS_PER_POD}",
    f"spec.<role>.multiNode: a DataParallel pod holds dataParallelSize / nodes ranks of "
    f"tensorParallelSize x pipelineParallelSize GPUs each, at most {MAX_GPUS_PER_POD} per pod "
    "(one node)",
    lambda role: (
        role.multi_node is None
        or gpus_per_pod(role.multi_node, role.tensor_parallel_size, role.pipeline_parallel_size)[0]
        <= MAX_GPUS_PER_POD
    ),
)


ROUTER_GPU_RULE = Rule(
    f"!has(self.resources) || ((!has(self.resources.requests) || "
    f"!('{v.GPU_RESOURCE}' in self.resources.requests)) && (!has(self.resources.limits) || "
    f"!('{v.GPU_RESOURCE}' in self.resources.limits)))",
    f"spec.router.resources must not ask for {v.GPU_RESOURCE}: vllm-router runs on CPU, and a "
    "GPU held by a router pod is one the engines cannot have",
    lambda router: (
        router.resources is None
        or v.GPU_RESOURCE not in {**router.resources.requests, **router.resources.limits}
    ),
)


TP_DIVISIBLE_RULE = Rule(
    "self.prefill.tensorParallelSize % self.decode.tensorParallelSize == 0 || "
    "self.decode.tensorParallelSize % self.prefill.tensorParallelSize == 0",
    "spec.prefill.tensorParallelSize and spec.decode.tensorParallelSize must divide "
    "one another (e.g. 8 and 4): Mooncake maps KV heads only between such sizes",
    finding=reasons.TENSOR_PARALLEL_INDIVISIBLE,
)


MAX_MODEL_LEN_RULE = Rule(
    "!has(self.prefill.maxModelLen) || !has(self.decode.maxModelLen) || "
    "self.decode.maxModelLen >= self.prefill.maxModelLen",
    "spec.decode.maxModelLen must be >= spec.prefill.maxModelLen: the decode "
    "continues every prompt the prefill accepted",
    finding=reasons.MAX_MODEL_LEN_MISMATCH,
)


SPECULATIVE_OVERRIDE_RULE = Rule(
    "has(self.speculative) || (!has(self.prefill.speculative) && !has(self.decode.speculative))",
    "spec.prefill.speculative and spec.decode.speculative override spec.speculative: "
    "set spec.speculative (method and numSpeculativeTokens) first",
    finding=reasons.SPECULATIVE_OVERRIDE_WITHOUT_METHOD,
)


DRAFT_MODEL_RULE = Rule(
    f"!has(self.speculative) || !(self.speculative.method in {r.cel_list(DRAFT_MODEL_METHODS)}) "
    "|| has(self.speculative.draftModel)",
    "spec.speculative.method drafts with a separate model (eagle, eagle3, draft_model): set "
    "spec.speculative.draftModel",
    finding=reasons.DRAFT_MODEL_MISSING,
)


# Per role, not across roles; the lookahead agreement itself (LookaheadMismatch,
# MTPModulesUnknown) stays the operator's and the webhook's (docs/design.md).
SPECULATIVE_TOKENS_DIVISIBLE_RULE = Rule(
    "!has(self.speculative) || !has(self.model.mtpModules) || "
    f"!(self.speculative.method in {r.cel_list(MTP_METHOD_ALIASES)}) || "
    + " && ".join(
        f"({k} <= self.model.mtpModules || {k} % self.model.mtpModules == 0)"
        for k in (r.cel_role_k("prefill"), r.cel_role_k("decode"))
    ),
    "numSpeculativeTokens (spec.speculative's, or a role's own) must be at most "
    "spec.model.mtpModules or a multiple of it: vLLM refuses more draft tokens than MTP modules "
    "otherwise",
    finding=reasons.SPECULATIVE_TOKENS_INDIVISIBLE,
)


def _token_ref(spec: Any) -> bool:
    source = spec.model.source
    return source is not None and source.hub is not None and source.hub.token_secret_ref is not None


HUB_TOKEN_RULE = Rule(
    "!has(self.model.source) || !has(self.model.source.hub) || "
    "!has(self.model.source.hub.tokenSecretRef) || "
    "((!has(self.prefill.env) || self.prefill.env.all(e, e.name != 'HF_TOKEN')) && "
    "(!has(self.decode.env) || self.decode.env.all(e, e.name != 'HF_TOKEN')))",
    "spec.model.source.hub.tokenSecretRef sets HF_TOKEN: remove HF_TOKEN from the roles' env",
    lambda spec: (
        not _token_ref(spec)
        or all(e.name != v.ENV_HF_TOKEN for role in (spec.prefill, spec.decode) for e in role.env)
    ),
)


def _effective_names(role: str, field: str) -> str:
    """CEL: the names in a role's effective pod list `field` (spec.<role>.pod's wins over
    spec.pod's). Mapped to names in each branch: the two lists' item types differ for CEL."""
    return (
        f"(has(self.{role}.pod) && has(self.{role}.pod.{field}) ? "
        f"self.{role}.pod.{field}.map(x, x.name) : "
        f"(has(self.pod) && has(self.pod.{field}) ? self.pod.{field}.map(x, x.name) : []))"
    )


def _mounts_resolve(spec: Any) -> bool:
    for role in (spec.prefill, spec.decode):
        pod = spec.pod if role.pod is None else role.pod.over(spec.pod)
        if pod is None:
            continue
        names = {vol.name for vol in pod.volumes or []} | set(v.RESERVED_VOLUMES)
        if any(m.name not in names for m in pod.volume_mounts or []):
            return False
    return True


MOUNTS_RULE = Rule(
    " && ".join(
        f"{_effective_names(role, 'volumeMounts')}.all(n, n in "
        + str(list(v.RESERVED_VOLUMES)).replace('"', "'")
        + f" || n in {_effective_names(role, 'volumes')})"
        for role in v.ENGINE_ROLES
    ),
    "each volumeMounts[].name must name a volume of the same pod (spec.pod.volumes, or the "
    "role's own spec.<role>.pod.volumes, which replace them)",
    _mounts_resolve,
)


def _effective_mounts(spec: Any) -> set[str]:
    names: set[str] = set()
    for role in (spec.prefill, spec.decode):
        pod = spec.pod if role.pod is None else role.pod.over(spec.pod)
        if pod is not None:
            names |= {m.name for m in pod.volume_mounts or []}
    return names


def _weights_volumes(spec: Any) -> set[str]:
    """The reserved volumes the model's source creates (dshm is always there)."""
    source = spec.model.source
    made = {v.SHM_VOLUME}
    if source is not None and (source.pvc is not None or source.image is not None):
        made.add(v.MODEL_VOLUME)
    if source is not None and source.hub is not None and source.hub.cache_pvc is not None:
        made.add(v.HF_CACHE_VOLUME)
    return made


_HAS_LOCAL_WEIGHTS = (
    "(has(self.model.source) && (has(self.model.source.pvc) || has(self.model.source.image)))"
)


_HAS_HUB_CACHE = (
    "(has(self.model.source) && has(self.model.source.hub) && has(self.model.source.hub.cachePvc))"
)


WEIGHTS_MOUNT_RULE = Rule(
    " && ".join(
        f"{_effective_names(role, 'volumeMounts')}.all(n, "
        f"(n != '{v.MODEL_VOLUME}' || {_HAS_LOCAL_WEIGHTS}) && "
        f"(n != '{v.HF_CACHE_VOLUME}' || {_HAS_HUB_CACHE}))"
        for role in v.ENGINE_ROLES
    ),
    f"a volumeMounts[] entry names the operator's volume '{v.MODEL_VOLUME}' (created only for a "
    f"pvc or image spec.model.source) or '{v.HF_CACHE_VOLUME}' (only for "
    "spec.model.source.hub.cachePvc) that this spec's model source does not create",
    lambda spec: (
        not (
            _effective_mounts(spec) & ({v.MODEL_VOLUME, v.HF_CACHE_VOLUME} - _weights_volumes(spec))
        )
    ),
)


def _canary_fits(spec: Any) -> bool:
    rollout = spec.rollout
    if rollout.canary is None or rollout.max_surge > 0:
        return True
    return all(
        _lowest_replicas(spec, role) * (100 - rollout.canary.percent) >= 100
        for role in v.ENGINE_ROLES
    )


def _lowest_replicas(spec: Any, role: str) -> int:
    scaling = None if spec.autoscaling is None else spec.autoscaling.role(role)
    return int(getattr(spec, role).replicas if scaling is None else scaling.min_replicas)


def _cel_lowest(role: str) -> str:
    scaling = f"self.autoscaling.{role}"
    return (
        f"(has(self.autoscaling) && has({scaling}) ? {scaling}.minReplicas : self.{role}.replicas)"
    )


CANARY_BUDGET_RULE = Rule(
    # The share is ceil(R x percent / 100), at least 1; with maxSurge 0 the two revisions share
    # R pods, so the old one keeps one only while share <= R - 1, i.e. R x (100 - p) >= 100.
    # The lowest count a role may run (minReplicas when autoscaled) is the hardest case.
    "!has(self.rollout.canary) || self.rollout.maxSurge > 0 || ("
    + " && ".join(
        f"{_cel_lowest(role)} * (100 - self.rollout.canary.percent) >= 100"
        for role in v.ENGINE_ROLES
    )
    + ")",
    "spec.rollout.canary: with maxSurge 0 the new and the old revision share each role's "
    "replicas, and the canary's share (percent of replicas, rounded up, at least one pod) leaves "
    "the old revision no pod in a role of this size (its minReplicas when autoscaled): the "
    "rollout would run in full with no hold; set maxSurge: 1 or a lower percent",
    _canary_fits,
)

"""The shape of a replica that spans nodes (spec.<role>.multiNode): one replica of the role is a
group of pods, one per node, that vLLM runs as one engine and Kubernetes gang-schedules (the
Workload API's PodGroup) and that is replaced as one.

vLLM 0.33 spans nodes in two ways, both with the multiprocessing backend (no Ray):

- **DataParallel**: `dataParallelSize` engine ranks (each tensorParallelSize x pipelineParallelSize
  GPUs), `dataParallelSize / nodes` of them on each pod; the leader runs the API server and the
  DP coordinator (`--data-parallel-address/--data-parallel-rpc-port`), the other pods run
  `--headless` from their start rank. Wide expert parallelism adds `--enable-expert-parallel`.
- **TensorParallel**: one engine whose tensorParallelSize x pipelineParallelSize GPUs are split
  evenly over the pods (`--nnodes/--node-rank/--master-addr/--master-port`, ranks > 0 headless).

The rules below mirror vLLM 0.33's own checks of these shapes (`EngineArgs.create_engine_config`
in vllm/engine/arg_utils.py, `ParallelConfig` in vllm/config/parallel.py, `serve`'s headless path
in vllm/entrypoints/cli/serve.py), so a spec the engine would refuse at start-up is refused at
admission instead: the wiring flags are owned (`pdmtp.api.flags`), and a multi-node role's
extraArgs (its own and spec.engine's) leave the group's sizes, backend, load balancing and API
servers alone (`GROUP_ARGS`).

Like the rest of `pdmtp.api`, this module imports nothing from `pdmtp.core`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

from pydantic import ConfigDict, Field

from pdmtp.api import rules as r
from pdmtp.api.base import Model
from pdmtp.api.flags import flag_pattern, flags_in
from pdmtp.api.rules import Checked, Rule, model_rules

Layout = Literal["DataParallel", "TensorParallel"]
LAYOUTS: Final[tuple[Layout, ...]] = ("DataParallel", "TensorParallel")

MAX_NODES: Final = 64
MAX_GPUS_PER_POD: Final = 64

DP_SIZE_REQUIRED_RULE = Rule(
    "self.layout != 'DataParallel' || has(self.dataParallelSize)",
    "multiNode.layout DataParallel needs multiNode.dataParallelSize: the engine ranks of one "
    "replica, spread evenly over its nodes",
    lambda m: m.layout != "DataParallel" or m.data_parallel_size is not None,
)
DP_SIZE_UNUSED_RULE = Rule(
    "self.layout == 'DataParallel' || !has(self.dataParallelSize)",
    "multiNode.dataParallelSize is for layout DataParallel; a TensorParallel group splits the "
    "role's tensorParallelSize x pipelineParallelSize GPUs over its nodes",
    lambda m: m.layout == "DataParallel" or m.data_parallel_size is None,
)
DP_SIZE_DIVISIBLE_RULE = Rule(
    "!has(self.dataParallelSize) || self.dataParallelSize % self.nodes == 0",
    "multiNode.dataParallelSize must be a multiple of multiNode.nodes: each node runs the same "
    "number of data-parallel ranks (vLLM's --data-parallel-size-local)",
    lambda m: m.data_parallel_size is None or m.data_parallel_size % m.nodes == 0,
)


class MultiNodeSpec(Model):
    """One replica of the role spans `nodes` pods, one per node: gang-scheduled as one group
    (Kubernetes Workload API), Ready only when every pod is, replaced whole when any fails."""

    RULES = (DP_SIZE_REQUIRED_RULE, DP_SIZE_UNUSED_RULE, DP_SIZE_DIVISIBLE_RULE)
    model_config = ConfigDict(json_schema_extra=model_rules(*RULES))

    nodes: int = Field(
        ge=2,
        le=MAX_NODES,
        description=(
            "Pods in one replica, one per node (rank 0 is the leader, the only one the router "
            "lists)."
        ),
    )
    layout: Literal[LAYOUTS] = Field(  # type: ignore[valid-type]
        description=(
            "How vLLM spans the nodes: DataParallel (dataParallelSize ranks, the same number on "
            "each node; with expertParallel for wide-EP MoE) or TensorParallel (the role's "
            "tensorParallelSize x pipelineParallelSize GPUs split evenly over the nodes)."
        ),
    )
    data_parallel_size: int | None = Field(
        default=None,
        ge=2,
        le=1024,
        description=(
            "DataParallel: engine ranks in one replica (`--data-parallel-size`), a multiple of "
            "nodes; each rank has tensorParallelSize x pipelineParallelSize GPUs."
        ),
    )
    expert_parallel: bool = Field(
        default=False,
        description=(
            "Shard MoE experts over the ranks (`--enable-expert-parallel`); vLLM refuses it for "
            "a model without experts. Needed for `--enable-eplb` in extraArgs."
        ),
    )
    topology_key: (
        Annotated[
            str,
            Field(min_length=1, max_length=317),
            Checked(
                Rule(
                    f"self.matches('{r.re2(r.QUALIFIED_NAME)}')",
                    "multiNode.topologyKey must be a node label key (a qualified name such as "
                    "topology.kubernetes.io/zone)",
                    r.matches(r.QUALIFIED_NAME),
                )
            ),
        ]
        | None
    ) = Field(
        default=None,
        description=(
            "A node label key: every pod of a group lands on nodes with the same value of it "
            "(one rack, one NVLink domain). Needs the scheduler's topology-aware workload "
            "scheduling; a change rolls the role."
        ),
    )


def gpus_per_pod(
    shape: Any, tensor_parallel_size: int, pipeline_parallel_size: int
) -> tuple[int, int]:
    """(whole GPUs per pod, remainder) of a role whose replica has `shape` (a MultiNodeSpec or
    None): the remainder is non-zero only for a TensorParallel group its nodes cannot split."""
    world = tensor_parallel_size * pipeline_parallel_size
    if shape is None:
        return world, 0
    if shape.layout == "DataParallel":
        return (shape.data_parallel_size or shape.nodes) // shape.nodes * world, 0
    return world // shape.nodes, world % shape.nodes


# ---- what a multi-node role's extraArgs leave alone ----------------------------------------


@dataclass(frozen=True)
class GroupArgs:
    """`vllm serve` flags a role with multiNode must not carry in its extraArgs or in
    spec.engine.extraArgs (which reach every rank): `why` is vLLM's check and the fix."""

    flags: tuple[str, ...]
    why: str

    @property
    def pattern(self) -> str:
        return flag_pattern(self.flags)

    def found(self, args: Iterable[str]) -> list[str]:
        return flags_in(self.pattern, self.flags, args)


GROUP_ARGS: Final = (
    GroupArgs(
        (
            "--data-parallel-size",
            "-dp",
            "--enable-expert-parallel",
            "-ep",
            "--no-enable-expert-parallel",
            "--enable-elastic-ep",
            "--elastic-ep-max-dp-size",
        ),
        "multiNode sets them, the same on every rank of a group, and a group's size is fixed "
        "(elastic EP would change it at run time): set multiNode.dataParallelSize and "
        "multiNode.expertParallel instead",
    ),
    GroupArgs(
        ("--prefill-context-parallel-size", "-pcp"),
        "vLLM counts it into the world size that --nnodes must divide and into each rank's GPUs, "
        "which pdmtp sizes from tensorParallelSize x pipelineParallelSize: remove it",
    ),
    GroupArgs(
        ("--distributed-executor-backend", "--data-parallel-backend", "-dpb"),
        "a group runs vLLM's multiprocessing backend, with no Ray cluster in its pods (vLLM "
        "refuses --nnodes > 1 with --data-parallel-backend ray or an executor other than mp, "
        "uni or external_launcher): remove it",
    ),
    GroupArgs(
        (
            "--data-parallel-hybrid-lb",
            "-dph",
            "--data-parallel-external-lb",
            "-dpe",
            "--data-parallel-multi-port-external-lb",
            "-dpm",
            "--enable-fault-tolerance",
            "--fault-tolerance-config",
        ),
        "a group is one engine behind its leader's API server (vLLM's internal load balancing; "
        "vLLM refuses hybrid LB on the headless ranks, two LB modes at once, and fault "
        "tolerance without external LB): remove it",
    ),
    GroupArgs(
        ("--api-server-count", "-asc"),
        "the ranks after the leader run --headless, and vLLM refuses --api-server-count in "
        "headless mode: remove it",
    ),
)

EPLB_FLAGS: Final = ("--enable-eplb",)
EPLB_PATTERN: Final = flag_pattern(EPLB_FLAGS)

_ROLES: Final = ("prefill", "decode")


def _cel_free(args: str, pattern: str) -> str:
    """CEL: the list `args` (a field, maybe unset) sets none of the flags `pattern` matches."""
    return f"(!has({args}) || {args}.all(a, !a.matches('{r.re2(pattern)}')))"


def _cel_eplb_ok(role: str) -> str:
    """CEL: the multi-node role `role` (a path) can run EPLB: expert parallel over more than
    one rank (a DataParallel group, or tensorParallelSize > 1)."""
    shape = f"{role}.multiNode"
    return (
        f"(has({shape}.expertParallel) && {shape}.expertParallel && "
        f"({shape}.layout == 'DataParallel' || {role}.tensorParallelSize > 1))"
    )


def _eplb_ok(role: Any) -> bool:
    shape = role.multi_node
    return bool(shape.expert_parallel) and (
        shape.layout == "DataParallel" or role.tensor_parallel_size > 1
    )


def _shown(flags: tuple[str, ...]) -> str:
    """`--data-parallel-size/-dp, --enable-expert-parallel/-ep`: a short form after its long."""
    shown: list[str] = []
    for flag in flags:
        if shown and not flag.startswith("--"):
            shown[-1] += "/" + flag
        else:
            shown.append(flag)
    return ", ".join(shown)


def role_args_rule(group: GroupArgs) -> Rule:
    """On a role: with multiNode, its own extraArgs set none of `group`'s flags."""
    return Rule(
        f"!has(self.multiNode) || {_cel_free('self.extraArgs', group.pattern)}",
        f"spec.<role>.extraArgs of a role with multiNode must not set {_shown(group.flags)}: "
        f"{group.why}",
        lambda role: role.multi_node is None or not group.found(role.extra_args),
    )


def engine_args_rule(group: GroupArgs) -> Rule:
    """On the spec: while a role has multiNode, spec.engine.extraArgs set none of them."""
    grouped = " || ".join(f"has(self.{role}.multiNode)" for role in _ROLES)
    return Rule(
        f"!({grouped}) || !has(self.engine) || {_cel_free('self.engine.extraArgs', group.pattern)}",
        f"spec.engine.extraArgs must not set {_shown(group.flags)} while a role has multiNode "
        f"(they reach every rank of both roles): {group.why}",
        lambda spec: (
            all(getattr(spec, role).multi_node is None for role in _ROLES)
            or not group.found(spec.engine.extra_args)
        ),
    )


EPLB_WHY: Final = (
    "needs expert parallelism over more than one rank, which for a role with multiNode is "
    "multiNode.expertParallel: true with layout DataParallel or tensorParallelSize > 1 (vLLM: "
    "enable_expert_parallel must be True to use EPLB, and EPLB needs tensor or data "
    "parallelism): set them or remove --enable-eplb"
)
ROLE_EPLB_RULE: Final = Rule(
    f"!has(self.multiNode) || {_cel_eplb_ok('self')} || "
    f"{_cel_free('self.extraArgs', EPLB_PATTERN)}",
    f"spec.<role>.extraArgs: --enable-eplb in a role with multiNode {EPLB_WHY}",
    lambda role: (
        role.multi_node is None
        or _eplb_ok(role)
        or not flags_in(EPLB_PATTERN, EPLB_FLAGS, role.extra_args)
    ),
)
ENGINE_EPLB_RULE: Final = Rule(
    "!has(self.engine) || "
    + f"{_cel_free('self.engine.extraArgs', EPLB_PATTERN)} || ("
    + " && ".join(
        f"(!has(self.{role}.multiNode) || {_cel_eplb_ok(f'self.{role}')})" for role in _ROLES
    )
    + ")",
    "spec.engine.extraArgs: --enable-eplb reaches every role, and a role with multiNode "
    + EPLB_WHY,
    lambda spec: (
        not flags_in(EPLB_PATTERN, EPLB_FLAGS, spec.engine.extra_args)
        or all(
            getattr(spec, role).multi_node is None or _eplb_ok(getattr(spec, role))
            for role in _ROLES
        )
    ),
)

ROLE_GROUP_ARGS_RULES: Final = (*(role_args_rule(g) for g in GROUP_ARGS), ROLE_EPLB_RULE)
"""On spec.<role>: a multi-node role's own extraArgs."""
ENGINE_GROUP_ARGS_RULES: Final = (*(engine_args_rule(g) for g in GROUP_ARGS), ENGINE_EPLB_RULE)
"""On spec: spec.engine.extraArgs while a role spans nodes."""

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

Like the rest of `pdmtp.api`, this module imports nothing from `pdmtp.core`.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import ConfigDict, Field

from pdmtp.api import rules as r
from pdmtp.api.base import Model
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
        description="Shard MoE experts over the ranks (`--enable-expert-parallel`).",
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

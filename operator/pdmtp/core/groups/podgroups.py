"""A multi-node replica (spec.<role>.multiNode) as Kubernetes objects, and its ranks' wiring.

One replica of such a role is a *group*: `nodes` pods, one per node, that vLLM runs as one engine.
Per group the operator writes a PodGroup (the Workload API's gang: `minCount` = the group's size,
so the scheduler binds all of its pods or none) and the pods themselves, owned by the
PDDeployment and joined to the PodGroup through `spec.schedulingGroup`. Per (revision, role) one
headless Service gives every pod a DNS name, which is how the workers find their leader.

Why pods and not a Deployment or a StatefulSet: a group is replaced whole (vLLM's ranks cannot
rejoin a running engine) under a new PodGroup (the gang covers a group's first placement only),
and no built-in workload does either (docs/design.md, "A replica that spans nodes").

Group ids are `g<n>`; a new group takes the lowest number no object of the (revision, role) holds,
so names are deterministic from what is observed. Nothing here reads the cluster or the clock.
"""

from __future__ import annotations

import copy

from pdmtp.api import vocabulary as v
from pdmtp.api.multinode import MultiNodeSpec, gpus_per_pod
from pdmtp.api.v1alpha1 import PDDeployment
from pdmtp.api.vocabulary import EngineRole
from pdmtp.core import names
from pdmtp.core.agreement import Agreement
from pdmtp.core.objects import Manifest

DEFAULT_WORKLOAD_API = f"{v.WORKLOAD_API_GROUP}/{v.WORKLOAD_API_VERSIONS[0]}"
"""The PodGroup apiVersion rendered offline (`pdmtp render`); the operator uses the served one."""
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def shape_of(agreement: Agreement, role: EngineRole) -> MultiNodeSpec | None:
    """The role's multi-node shape, None for one pod per replica."""
    return agreement.settings.role(role).compat.multi_node


def missing_workload_api(agreement: Agreement, workload_api: str | None) -> str | None:
    """Why a multi-node spec cannot be served (None: it can, or it is not multi-node)."""
    grouped = [r for r in v.ENGINE_ROLES if shape_of(agreement, r) is not None]
    if not grouped or workload_api is not None:
        return None
    return (
        f"spec.{grouped[0]}.multiNode needs the Kubernetes Workload API "
        f"({v.WORKLOAD_API_GROUP} PodGroup, versions {', '.join(v.WORKLOAD_API_VERSIONS)}) "
        "to gang-schedule its groups, and this API server serves none: enable the "
        "GenericWorkload feature gate and the API (--runtime-config) on the control plane, "
        "or remove multiNode"
    )


def leader_address(pdd: PDDeployment, revision: str, role: EngineRole, group_id: str) -> str:
    """The leader's DNS name through the role's headless Service (resolvable before it is
    Ready: the Service publishes not-ready addresses)."""
    service = names.workload(pdd.metadata.name, revision, role)
    return f"{names.group_hostname(group_id, 0)}.{service}.{pdd.metadata.namespace}.svc"


def rank_args(shape: MultiNodeSpec, rank: int, leader: str) -> list[str]:
    """The `vllm serve` flags that make one pod rank `rank` of its group."""
    if shape.layout == "DataParallel":
        size = shape.data_parallel_size or shape.nodes
        local = size // shape.nodes
        args = [
            "--data-parallel-size",
            str(size),
            "--data-parallel-size-local",
            str(local),
            "--data-parallel-address",
            leader,
            "--data-parallel-rpc-port",
            str(v.DP_RPC_PORT),
        ]
        if rank > 0:
            args += ["--headless", "--data-parallel-start-rank", str(rank * local)]
    else:
        args = [
            "--nnodes",
            str(shape.nodes),
            "--node-rank",
            str(rank),
            "--master-addr",
            leader,
            "--master-port",
            str(v.MASTER_PORT),
        ]
        if rank > 0:
            args.append("--headless")
    if shape.expert_parallel:
        args.append("--enable-expert-parallel")
    return args


def _with_rank_args(args: list[str], extra: list[str]) -> list[str]:
    """Rank flags go before the user's own extraArgs (after every typed flag): the tail of the
    typed flags ends with --kv-transfer-config and its value."""
    at = args.index("--kv-transfer-config") + 2
    return [*args[:at], *extra, *args[at:]]


def _gpus(container: Manifest, gpus: int) -> None:
    for part in ("requests", "limits"):
        container["resources"][part][v.GPU_RESOURCE] = gpus


def group_pod_manifest(
    pdd: PDDeployment,
    revision: str,
    role: EngineRole,
    group_id: str,
    rank: int,
    template: Manifest,
    agreement: Agreement,
    pod_group_api: str = DEFAULT_WORKLOAD_API,
) -> Manifest:
    """Pod `rank` of a group, from the role's pod template (`render.engine_pod_template`)."""
    del pod_group_api  # the pod names its PodGroup by name; the API version is the PodGroup's
    shape = shape_of(agreement, role)
    assert shape is not None, f"{role} has no multiNode shape"
    name = pdd.metadata.name
    compat = agreement.settings.role(role).compat
    leader = leader_address(pdd, revision, role, group_id)
    pod = copy.deepcopy(template)
    spec = pod["spec"]
    container = spec["containers"][0]
    container["args"] = _with_rank_args(container["args"], rank_args(shape, rank, leader))
    container["env"] += [
        {"name": v.ENV_GROUP, "value": group_id},
        {"name": v.ENV_GROUP_RANK, "value": str(rank)},
        {"name": v.ENV_GROUP_SIZE, "value": str(shape.nodes)},
        {"name": v.ENV_LEADER_ADDRESS, "value": leader},
    ]
    gpus, _ = gpus_per_pod(shape, compat.tensor_parallel_size, compat.pipeline_parallel_size)
    _gpus(container, gpus)
    if rank > 0:
        # A headless rank serves no HTTP, so it has no probe. A lost rank is seen in the pods'
        # status (core.groups.grouping replaces the group), not in the leader's /health: vLLM 0.32's
        # leader kept answering 200 after its worker was killed (docs/benchmarks.md).
        for probe in PROBES:
            container.pop(probe, None)
    workload = names.workload(name, revision, role)
    spec["hostname"] = names.group_hostname(group_id, rank)
    spec["subdomain"] = workload
    spec["schedulingGroup"] = {"podGroupName": names.group(name, revision, role, group_id)}
    # One pod per node: a group's pods never share a node, whatever their GPU count.
    members = {"matchLabels": names.group_labels(name, revision, role, group_id)}
    apart = {"labelSelector": members, "topologyKey": "kubernetes.io/hostname"}
    spec.setdefault("affinity", {}).setdefault("podAntiAffinity", {}).setdefault(
        "requiredDuringSchedulingIgnoredDuringExecution", []
    ).append(apart)
    labels = {**pod["metadata"]["labels"], v.LABEL_GROUP: group_id, v.LABEL_GROUP_RANK: str(rank)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": names.group_pod(name, revision, role, group_id, rank),
            "namespace": pdd.metadata.namespace,
            "labels": labels,
            "annotations": dict(pod["metadata"].get("annotations") or {}),
            "ownerReferences": [names.owner_reference(pdd)],
        },
        "spec": spec,
    }


def pod_group(
    pdd: PDDeployment,
    revision: str,
    role: EngineRole,
    group_id: str,
    agreement: Agreement,
    api_version: str = DEFAULT_WORKLOAD_API,
) -> Manifest:
    """The PodGroup of one group: a gang of all its pods, inside one topology domain if asked."""
    shape = shape_of(agreement, role)
    assert shape is not None, f"{role} has no multiNode shape"
    name = pdd.metadata.name
    spec: Manifest = {"schedulingPolicy": {"gang": {"minCount": shape.nodes}}}
    if shape.topology_key is not None:
        spec["schedulingConstraints"] = {"topology": [{"key": shape.topology_key}]}
    return {
        "apiVersion": api_version,
        "kind": v.POD_GROUP_KIND,
        "metadata": {
            "name": names.group(name, revision, role, group_id),
            "namespace": pdd.metadata.namespace,
            "labels": names.group_labels(name, revision, role, group_id),
            "ownerReferences": [names.owner_reference(pdd)],
        },
        "spec": spec,
    }


def group_service(pdd: PDDeployment, revision: str, role: EngineRole) -> Manifest:
    """The headless Service of a (revision, multi-node role): DNS names for its pods, the
    leaders' included before they are Ready (the workers must reach them to start)."""
    name = pdd.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": names.workload(name, revision, role),
            "namespace": pdd.metadata.namespace,
            "labels": names.pod_labels(name, revision, role),
            "ownerReferences": [names.owner_reference(pdd)],
        },
        "spec": {
            "clusterIP": "None",
            "selector": names.selector(name, revision, role),
            "publishNotReadyAddresses": True,
            "ports": [{"name": "http", "port": v.ENGINE_HTTP_PORT, "protocol": "TCP"}],
        },
    }


def group_objects(
    pdd: PDDeployment,
    revision: str,
    role: EngineRole,
    group_id: str,
    template: Manifest,
    agreement: Agreement,
    api_version: str = DEFAULT_WORKLOAD_API,
) -> list[Manifest]:
    """A whole group: its PodGroup first, then its pods by rank."""
    shape = shape_of(agreement, role)
    assert shape is not None, f"{role} has no multiNode shape"
    pods = [
        group_pod_manifest(pdd, revision, role, group_id, rank, template, agreement)
        for rank in range(shape.nodes)
    ]
    return [pod_group(pdd, revision, role, group_id, agreement, api_version), *pods]


def next_group_ids(taken: set[str], count: int) -> list[str]:
    """`count` group ids no object holds, lowest numbers first."""
    out: list[str] = []
    n = 0
    while len(out) < count:
        gid = names.group_id(n)
        if gid not in taken:
            out.append(gid)
        n += 1
    return out

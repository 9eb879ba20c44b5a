"""The admission corpus: bad pod settings (issue 21) and specs that parse but cannot work as
written (issue 29: autoscaling, the band's arithmetic, rendered objects, credentials in args, the
canary's budget), each with the layer that refuses it, and valid neighbours accepted by all.

`schema` and `CEL`: the CRD (Kubernetes' core/v1 schemas, list-map keys, our rules) refuses it at
`kubectl apply`, and `pdmtp validate` refuses it offline, both with `words`. `webhook`: only the
Deployment's own validation knows; `kubectl apply` stores it without the webhook, the webhook's
dry run of the children refuses it, and so does `pdmtp validate --server`; offline `pdmtp
validate` accepts it. `accepted`: Kubernetes accepts it too (shown so the line is drawn).

tests/cluster/test_pod_admission.py proves every row against a real API server;
tests/unit/test_pod_corpus.py keeps docs/validation-corpus.md equal to `table()`.

`MULTI_NODE`: the shapes a multi-node role (spec.<role>.multiNode) cannot take, each the mirror
of one of vLLM 0.33's own start-up checks or of what the operator renders, and the shapes it can;
tests/unit/test_multinode_validation.py proves each row offline (`pdmtp validate`) and
tests/cluster/test_validation_corpus.py on the real API server:

    .venv/bin/python tests/cluster/pod_corpus.py > docs/validation-corpus.md
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / p) for p in ("", "support")]

from builders import pdd  # noqa: E402

Doc = dict[str, Any]


@dataclass(frozen=True)
class Case:
    name: str
    change: Callable[[Doc], None]
    layer: str
    """schema, CEL, rule (pdmtp's own check, which CEL cannot express), webhook or accepted."""
    words: str
    """Text every refusal contains (offline, kubectl apply or the webhook, validate --server)."""


def base() -> Doc:
    return pdd("corpus").mtp(3, modules=3).dict()


def doc(case: Case | Shape) -> Doc:
    out = copy.deepcopy(base())
    case.change(out)
    return out


def pod(**fields: Any) -> Callable[[Doc], None]:
    def change(d: Doc) -> None:
        d["spec"].setdefault("pod", {}).update(copy.deepcopy(fields))

    return change


def role(name: str, **fields: Any) -> Callable[[Doc], None]:
    def change(d: Doc) -> None:
        d["spec"][name].update(copy.deepcopy(fields))

    return change


def node_term(**expression: Any) -> Doc:
    term = {"matchExpressions": [{"key": "rack", **expression}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [term]
    }}}  # fmt: skip


def spread(**fields: Any) -> list[Doc]:
    return [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule", **fields}]


EMPTY = {"emptyDir": {}}
CASES = [
    # ---- the cases
    Case(
        "node affinity with operator Near",
        pod(affinity=node_term(operator="Near", values=["a"])),
        "schema",
        'operator: Unsupported value: "Near"',
    ),
    Case(
        "topologySpreadConstraints entry without maxSkew",
        pod(
            topologySpreadConstraints=[
                {"topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}
            ]
        ),
        "schema",
        "spec.pod.topologySpreadConstraints[0].maxSkew: Required value",
    ),
    Case(
        'podSecurityContext {runAsUser: "root"}',
        pod(podSecurityContext={"runAsUser": "root"}),
        "schema",
        "spec.pod.podSecurityContext.runAsUser: Invalid value",
    ),
    Case(
        "a volume with no source",
        pod(volumes=[{"name": "data"}]),
        "CEL",
        "a volume sets exactly one source",
    ),
    Case(
        "two volumes of one name",
        pod(volumes=[{"name": "data", **EMPTY}, {"name": "data", **EMPTY}]),
        "schema",
        "spec.pod.volumes[1]: Duplicate value",
    ),
    Case(
        "a mount of a volume that does not exist",
        pod(volumeMounts=[{"name": "data", "mountPath": "/data"}]),
        "CEL",
        "each volumeMounts[].name must name a volume of the same pod",
    ),
    Case(
        'nvidia.com/gpu: "0.5"',
        role("decode", resources={"limits": {"nvidia.com/gpu": "0.5"}}),
        "CEL",
        "extended resources such as nvidia.com/gpu must be whole numbers",
    ),
    # ---- more the schema refuses
    Case(
        "two env entries of one name",
        role("prefill", env=[{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]),
        "schema",
        "spec.prefill.env[1]: Duplicate value",
    ),
    Case(
        "two mounts at one path",
        pod(
            volumes=[{"name": "data", **EMPTY}],
            volumeMounts=[{"name": "data", "mountPath": "/d"}, {"name": "data", "mountPath": "/d"}],
        ),
        "schema",
        "spec.pod.volumeMounts[1]: Duplicate value",
    ),
    Case(
        "two spread constraints on one key and policy",
        pod(topologySpreadConstraints=spread() + spread(maxSkew=2)),
        "schema",
        "spec.pod.topologySpreadConstraints[1]: Duplicate value",
    ),
    Case(
        "whenUnsatisfiable: Sometimes",
        pod(topologySpreadConstraints=spread(whenUnsatisfiable="Sometimes")),
        "schema",
        'whenUnsatisfiable: Unsupported value: "Sometimes"',
    ),
    Case(
        "fsGroupChangePolicy: Never",
        pod(podSecurityContext={"fsGroupChangePolicy": "Never"}),
        "schema",
        'fsGroupChangePolicy: Unsupported value: "Never"',
    ),
    Case(
        "a typo in affinity (nodeAfinity)",
        pod(affinity={"nodeAfinity": {}}),
        "schema",
        "unknown field",
    ),
    Case(
        "emptyDir sizeLimit lots",
        pod(volumes=[{"name": "data", "emptyDir": {"sizeLimit": "lots"}}]),
        "schema",
        "spec.pod.volumes[0].emptyDir.sizeLimit",
    ),
    Case(
        "a volume with two sources",
        pod(volumes=[{"name": "data", **EMPTY, "secret": {"secretName": "s"}}]),
        "CEL",
        "a volume sets exactly one source",
    ),
    # ---- only the Deployment's own validation knows: the webhook's dry run
    Case(
        "maxSkew: 0",
        pod(topologySpreadConstraints=spread(maxSkew=0)),
        "webhook",
        "maxSkew: Invalid value: 0: must be greater than zero",
    ),
    Case(
        "maxSkew: -1",
        pod(topologySpreadConstraints=spread(maxSkew=-1)),
        "webhook",
        "maxSkew: Invalid value: -1: must be greater than zero",
    ),
    Case(
        "minDomains with whenUnsatisfiable ScheduleAnyway",
        pod(topologySpreadConstraints=spread(whenUnsatisfiable="ScheduleAnyway", minDomains=2)),
        "webhook",
        "can only use minDomains if whenUnsatisfiable=DoNotSchedule",
    ),
    Case(
        "an empty topologyKey",
        pod(topologySpreadConstraints=spread(topologyKey="")),
        "webhook",
        "topologyKey: Required value",
    ),
    Case(
        "node affinity operator In without values",
        pod(affinity=node_term(operator="In")),
        "webhook",
        "must be specified when `operator` is 'In' or 'NotIn'",
    ),
    Case(
        "runAsUser: -1",
        pod(podSecurityContext={"runAsUser": -1}),
        "webhook",
        "runAsUser: Invalid value: -1: must be between 0 and 2147483647",
    ),
    Case(
        "a sysctl name with spaces",
        pod(podSecurityContext={"sysctls": [{"name": "net ipv4", "value": "1"}]}),
        "webhook",
        "sysctls[0].name: Invalid value",
    ),
    Case(
        "a hostPath volume with an empty path",
        pod(volumes=[{"name": "host", "hostPath": {"path": ""}}]),
        "webhook",
        "hostPath.path: Required value",
    ),
    Case(
        "a mount's subPath with ..",
        pod(
            volumes=[{"name": "data", **EMPTY}],
            volumeMounts=[{"name": "data", "mountPath": "/d", "subPath": "../up"}],
        ),
        "webhook",
        "must not contain '..'",
    ),
    Case(
        "an extended resource requested without a limit",
        role("decode", resources={"requests": {"example.com/fpga": 1}}),
        "webhook",
        "Limit must be set for non overcommitable resources",
    ),
    # ---- Kubernetes takes it as well
    Case(
        "two identical tolerations (an atomic list)",
        role("prefill", tolerations=[{"key": "gpu", "operator": "Exists"}] * 2),
        "accepted",
        "",
    ),
]


# ---- issue 29: fields that must make sense, not only parse
def at(path: str, value: Any) -> Callable[[Doc], None]:
    """Set a dotted path of the spec (parents created)."""

    def change(d: Doc) -> None:
        *parents, last = path.split(".")
        node = d
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = copy.deepcopy(value)

    return change


def both(*changes: Callable[[Doc], None]) -> Callable[[Doc], None]:
    def change(d: Doc) -> None:
        for each in changes:
            each(d)

    return change


def decode_scaling(**fields: Any) -> Callable[[Doc], None]:
    return at("spec.autoscaling", {"decode": {"minReplicas": 1, "maxReplicas": 4, **fields}})


TOKENS = {"signal": "decodeTokensPerSecondPerPod", "value": 2000}
MOUNT_WORDS = "mountPath must be absolute and normalised"


def mount_at(path: str) -> Callable[[Doc], None]:
    return pod(
        volumes=[{"name": "data", **EMPTY}], volumeMounts=[{"name": "data", "mountPath": path}]
    )


def no_speculation(d: Doc) -> None:
    del d["spec"]["speculative"]


CASES += [
    Case(
        "autoscaling targets given but empty",
        decode_scaling(targets=[]),
        "CEL",
        "spec.autoscaling.<role>.targets is empty",
    ),
    Case(
        "kvCacheUsage target as a percent (80)",
        decode_scaling(targets=[{"signal": "kvCacheUsage", "value": 80}]),
        "CEL",
        "kvCacheUsage is a fraction of the KV cache (0..1",
    ),
    Case(
        "expectedAcceptanceLength 3.5 with numSpeculativeTokens 3",
        decode_scaling(targets=[TOKENS], expectedAcceptanceLength=3.5),
        "CEL",
        "it cannot exceed the decode role's numSpeculativeTokens",
    ),
    Case(
        "expectedAcceptanceLength 2.5 above the decode role's own k (2, its override)",
        both(
            role("prefill", speculative={"numSpeculativeTokens": 2}),
            role("decode", speculative={"numSpeculativeTokens": 2}),
            decode_scaling(targets=[TOKENS], expectedAcceptanceLength=2.5),
        ),
        "CEL",
        "it cannot exceed the decode role's numSpeculativeTokens",
    ),
    Case(
        "expectedAcceptanceLength equal to k (3)",
        decode_scaling(targets=[TOKENS], expectedAcceptanceLength=3),
        "accepted",
        "",
    ),
    Case(
        "decodeTokensPerSecondPerPod on the prefill role",
        at(
            "spec.autoscaling",
            {
                "prefill": {
                    "minReplicas": 1,
                    "maxReplicas": 2,
                    "targets": [TOKENS],
                    "expectedAcceptanceLength": 1.5,
                }
            },
        ),
        "CEL",
        "which a prefill pod never moves",
    ),
    Case(
        "decodeTokensPerSecondPerPod without spec.speculative",
        both(no_speculation, decode_scaling(targets=[TOKENS], expectedAcceptanceLength=1.5)),
        "CEL",
        "an engine without speculative decoding (spec.speculative unset) does not export",
    ),
    Case(
        "staleAfterSeconds 20 below intervalSeconds 30",
        both(
            decode_scaling(),
            at("spec.autoscaling.intervalSeconds", 30),
            at("spec.autoscaling.staleAfterSeconds", 20),
        ),
        "CEL",
        "spec.autoscaling.staleAfterSeconds must be greater than intervalSeconds",
    ),
    Case(
        "a band reached exactly (7 prefill : 100 decode at ratio.min 0.07; 7.000000000000001 "
        "in binary floating point)",
        both(
            role("prefill", replicas=7),
            at(
                "spec.autoscaling",
                {
                    "decode": {"minReplicas": 100, "maxReplicas": 100},
                    "ratio": {"min": 0.07, "max": 1},
                },
            ),
        ),
        "accepted",
        "",
    ),
    Case(
        "a band whose interval meets the bounds but no whole pair does (1 prefill : 2-3 decode "
        "in [0.4, 0.45])",
        at(
            "spec.autoscaling",
            {
                "decode": {"minReplicas": 2, "maxReplicas": 3},
                "ratio": {"min": 0.4, "max": 0.45},
            },
        ),
        "rule",
        "no prefill and decode counts within the roles' minReplicas",
    ),
    Case(
        "engine requests above limits (cpu 4 > 2)",
        role("decode", resources={"requests": {"cpu": "4"}, "limits": {"cpu": 2}}),
        "CEL",
        "resources.requests must not exceed resources.limits",
    ),
    Case(
        "router requests above limits (memory 2Gi > 1Gi)",
        at("spec.router.resources", {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}),
        "CEL",
        "resources.requests must not exceed resources.limits",
    ),
    Case(
        "a GPU on the router",
        at("spec.router.resources", {"limits": {"nvidia.com/gpu": 1}}),
        "CEL",
        "spec.router.resources must not ask for nvidia.com/gpu",
    ),
    Case(
        "8Ei of memory (unschedulable, not invalid)",
        role("decode", resources={"requests": {"memory": "8Ei"}, "limits": {"memory": "8Ei"}}),
        "accepted",
        "",
    ),
    Case("a mount at //models", mount_at("//models"), "CEL", MOUNT_WORDS),
    Case("a mount at /cache/../models", mount_at("/cache/../models"), "CEL", MOUNT_WORDS),
    Case("a mount at /", mount_at("/"), "CEL", MOUNT_WORDS),
    Case("a mount at /data/ (a trailing slash)", mount_at("/data/"), "accepted", ""),
    Case(
        "a mount of the weights volume with no pvc or image source",
        pod(volumeMounts=[{"name": "model", "mountPath": "/weights"}]),
        "CEL",
        "names the operator's volume 'model'",
    ),
    Case(
        "an image source's subPath with ..",
        at("spec.model.source", {"image": {"reference": "example.com/w:1", "subPath": "../etc"}}),
        "CEL",
        "spec.model.source.image.subPath is a relative path inside the volume, without '..'",
    ),
    Case(
        "a pvc source's subPath a..b (a name, not a '..' segment)",
        at("spec.model.source", {"pvc": {"claimName": "weights", "subPath": "a..b"}}),
        "accepted",
        "",
    ),
    Case(
        "a nodeSelector value with a final newline",
        role("decode", nodeSelector={"rack": "a\n"}),
        "CEL",
        "nodeSelector values must be label values",
    ),
    Case(
        "emptyDir sizeLimit with a final newline",
        pod(volumes=[{"name": "data", "emptyDir": {"sizeLimit": "1Gi\n"}}]),
        "schema",
        "spec.pod.volumes[0].emptyDir.sizeLimit",
    ),
    Case(
        "--api-key in a role's extraArgs",
        role("prefill", extraArgs=["--api-key", "sk-123"]),
        "CEL",
        "extraArgs must not carry credentials",
    ),
    Case(
        "--hf-token=... in spec.engine.extraArgs",
        at("spec.engine", {"extraArgs": ["--hf-token=hf_abc"]}),
        "CEL",
        "extraArgs must not carry credentials",
    ),
    Case(
        "--max-num-batched-tokens in extraArgs (no credential word)",
        role("decode", extraArgs=["--max-num-batched-tokens=8192"]),
        "accepted",
        "",
    ),
    Case(
        "a 50% canary with maxSurge 0 on one-pod roles",
        at("spec.rollout", {"maxSurge": 0, "maxUnavailable": 1, "canary": {"percent": 50}}),
        "CEL",
        "spec.rollout.canary: with maxSurge 0 the new and the old revision share",
    ),
    Case(
        "a 50% canary with maxSurge 0 on two-pod roles",
        both(
            role("prefill", replicas=2),
            role("decode", replicas=2),
            at("spec.rollout", {"maxSurge": 0, "maxUnavailable": 1, "canary": {"percent": 50}}),
        ),
        "accepted",
        "",
    ),
]


# ---- multi-node shapes (spec.<role>.multiNode) -----------------------------------------------
@dataclass(frozen=True)
class Shape:
    name: str
    change: Callable[[Doc], None]
    layer: str
    """schema, CEL (pdmtp validate: unusable, exit 2), owned (the owned-flags CEL rule; pdmtp
    validate: incompatible, exit 1) or accepted."""
    words: str
    """Text both refusals contain (`pdmtp validate` and `kubectl apply`)."""
    vllm: str = ""
    """The check of vLLM 0.33 the row mirrors ("" where the row is pdmtp's own)."""

    @property
    def exit_code(self) -> int:
        """`pdmtp validate`'s exit code for it."""
        return {"accepted": 0, "owned": 1}.get(self.layer, 2)


DP16_EP = {"nodes": 2, "layout": "DataParallel", "dataParallelSize": 16, "expertParallel": True}
TP2 = {"nodes": 2, "layout": "TensorParallel"}
ARGS = "spec.<role>.extraArgs of a role with multiNode must not set"
ENGINE_ARGS = "spec.engine.extraArgs must not set"
OWNED = "must not set flags owned by typed fields"
EPLB = "--enable-eplb in a role with multiNode needs expert parallelism over more than one rank"
ARG_UTILS = "arg_utils.py create_engine_config"
PARALLEL = "config/parallel.py ParallelConfig"


def grouped(role_name: str, shape: Doc, **fields: Any) -> Callable[[Doc], None]:
    """`role_name` spans nodes with `shape` (tensorParallelSize 1 unless `fields` say)."""
    return role(role_name, multiNode=shape, **{"tensorParallelSize": 1, **fields})


def engine_args(*args: str) -> Callable[[Doc], None]:
    return at("spec.engine", {"extraArgs": list(args)})


MULTI_NODE = [
    # ---- the shape itself
    Shape(
        "a group of one node",
        grouped("decode", {"nodes": 1, "layout": "TensorParallel"}),
        "schema",
        "spec.decode.multiNode.nodes",
    ),
    Shape(
        "layout Pipeline (not a layout)",
        grouped("decode", {"nodes": 2, "layout": "Pipeline"}, tensorParallelSize=2),
        "schema",
        "spec.decode.multiNode.layout",
    ),
    Shape(
        "DataParallel without dataParallelSize",
        grouped("decode", {"nodes": 2, "layout": "DataParallel"}),
        "CEL",
        "multiNode.layout DataParallel needs multiNode.dataParallelSize",
    ),
    Shape(
        "TensorParallel with a dataParallelSize",
        grouped("decode", {**TP2, "dataParallelSize": 4}, tensorParallelSize=2),
        "CEL",
        "multiNode.dataParallelSize is for layout DataParallel",
    ),
    Shape(
        "dataParallelSize 6 over 4 nodes",
        grouped("decode", {"nodes": 4, "layout": "DataParallel", "dataParallelSize": 6}),
        "CEL",
        "multiNode.dataParallelSize must be a multiple of multiNode.nodes",
        f"{PARALLEL}: data_parallel_size_local <= data_parallel_size, the same on every node",
    ),
    Shape(
        "TensorParallel 4 GPUs over 3 nodes",
        grouped("prefill", {"nodes": 3, "layout": "TensorParallel"}, tensorParallelSize=4),
        "CEL",
        "spec.<role>.multiNode.nodes must divide the role's tensorParallelSize x",
        f"{ARG_UTILS}: --nnodes must evenly divide the total world size",
    ),
    Shape(
        "TensorParallel tensorParallelSize 2 x pipelineParallelSize 3 over 4 nodes",
        grouped(
            "prefill",
            {"nodes": 4, "layout": "TensorParallel"},
            tensorParallelSize=2,
            pipelineParallelSize=3,
        ),
        "CEL",
        "spec.<role>.multiNode.nodes must divide the role's tensorParallelSize x",
        f"{ARG_UTILS}: --nnodes must evenly divide the total world size",
    ),
    Shape(
        "DataParallel 128 ranks of 2 GPUs on 2 nodes (128 GPUs a pod)",
        grouped(
            "decode",
            {"nodes": 2, "layout": "DataParallel", "dataParallelSize": 128},
            tensorParallelSize=2,
        ),
        "CEL",
        "at most 64 per pod",
    ),
    Shape(
        "a topologyKey with a space",
        grouped("decode", {**DP16_EP, "topologyKey": "rack zone"}),
        "CEL",
        "multiNode.topologyKey must be a node label key",
    ),
    # ---- extraArgs that would undo the group (its sizes, backend, load balancing, servers)
    Shape(
        "--data-parallel-size in a multi-node role's extraArgs",
        grouped("decode", DP16_EP, extraArgs=["--data-parallel-size", "8"]),
        "CEL",
        f"{ARGS} --data-parallel-size/-dp",
    ),
    Shape(
        "-ep in spec.engine.extraArgs while decode spans nodes",
        both(grouped("decode", DP16_EP), engine_args("-ep")),
        "CEL",
        f"{ENGINE_ARGS} --data-parallel-size/-dp, --enable-expert-parallel/-ep",
    ),
    Shape(
        "--no-enable-expert-parallel in an expert-parallel group's extraArgs",
        grouped("decode", DP16_EP, extraArgs=["--no-enable-expert-parallel"]),
        "CEL",
        f"{ARGS} --data-parallel-size/-dp",
    ),
    Shape(
        "-pcp 2 in a TensorParallel group's extraArgs",
        grouped("prefill", TP2, tensorParallelSize=8, extraArgs=["-pcp", "2"]),
        "CEL",
        f"{ARGS} --prefill-context-parallel-size/-pcp",
        f"{ARG_UTILS}: the world size --nnodes divides is DP x PP x TP x PCP",
    ),
    Shape(
        "--distributed-executor-backend ray in a TensorParallel group",
        grouped(
            "prefill",
            TP2,
            tensorParallelSize=8,
            extraArgs=["--distributed-executor-backend", "ray"],
        ),
        "CEL",
        f"{ARGS} --distributed-executor-backend, --data-parallel-backend/-dpb",
        f"{PARALLEL}.__post_init__: nnodes > 1 only with executor backend mp, uni or "
        "external_launcher",
    ),
    Shape(
        "--data-parallel-backend=ray in spec.engine.extraArgs while decode spans nodes",
        both(grouped("decode", DP16_EP), engine_args("--data-parallel-backend=ray")),
        "CEL",
        f"{ENGINE_ARGS} --distributed-executor-backend, --data-parallel-backend/-dpb",
        f"{ARG_UTILS}: --nnodes > 1 requires --data-parallel-backend mp",
    ),
    Shape(
        "--data-parallel-hybrid-lb in a DataParallel group",
        grouped("decode", DP16_EP, extraArgs=["--data-parallel-hybrid-lb"]),
        "CEL",
        f"{ARGS} --data-parallel-hybrid-lb/-dph",
        f"{ARG_UTILS}: data_parallel_hybrid_lb is not applicable in headless mode",
    ),
    Shape(
        "--enable-fault-tolerance in a DataParallel group",
        grouped("decode", DP16_EP, extraArgs=["--enable-fault-tolerance"]),
        "CEL",
        f"{ARGS} --data-parallel-hybrid-lb/-dph",
        f"{ARG_UTILS}: fault tolerance requires external load balancer mode",
    ),
    Shape(
        "--api-server-count 2 in a DataParallel group",
        grouped("decode", DP16_EP, extraArgs=["--api-server-count", "2"]),
        "CEL",
        f"{ARGS} --api-server-count/-asc",
        "entrypoints/cli/serve.py: --api-server-count cannot be used with --headless",
    ),
    Shape(
        "--enable-eplb in a group without expertParallel",
        grouped("decode", {**DP16_EP, "expertParallel": False}, extraArgs=["--enable-eplb"]),
        "CEL",
        EPLB,
        f"{PARALLEL}: enable_expert_parallel must be True to use EPLB",
    ),
    Shape(
        "--enable-eplb in spec.engine.extraArgs, a TensorParallel group of tensorParallelSize 1",
        both(
            grouped("prefill", {**TP2, "expertParallel": True}, pipelineParallelSize=2),
            engine_args("--enable-eplb"),
        ),
        "CEL",
        EPLB.replace("--enable-eplb in a role", "--enable-eplb reaches every role, and a role"),
        f"{PARALLEL}: EPLB requires tensor, prefill-context, or data parallelism",
    ),
    # ---- the wiring the operator gives each rank (owned flags, in every spec)
    Shape(
        "--headless in a role's extraArgs", role("decode", extraArgs=["--headless"]), "owned", OWNED
    ),
    Shape(
        "-n2 in spec.engine.extraArgs (a short form with its value attached)",
        engine_args("-n2"),
        "owned",
        OWNED,
        f"{ARG_UTILS}: --node-rank between 0 and --nnodes - 1 (the operator sets both per rank)",
    ),
    Shape(
        "--data-parallel-start-rank in a multi-node role's extraArgs",
        grouped("decode", DP16_EP, extraArgs=["--data-parallel-start-rank=8"]),
        "owned",
        OWNED,
        f"{PARALLEL}.__post_init__: data_parallel_rank within [0, data_parallel_size); "
        "entrypoints/cli/serve.py: a start rank beside an API server is hybrid LB",
    ),
    Shape(
        "--master-port in a TensorParallel group's extraArgs",
        grouped("prefill", TP2, tensorParallelSize=8, extraArgs=["--master-port=29600"]),
        "owned",
        OWNED,
    ),
    # ---- shapes that work
    Shape(
        "2 nodes, DataParallel 16 with expert parallel, one rack (decode)",
        grouped("decode", {**DP16_EP, "topologyKey": "topology.kubernetes.io/zone"}),
        "accepted",
        "",
    ),
    Shape(
        "2 nodes, TensorParallel 16 GPUs (prefill; decode tensorParallelSize 8)",
        both(
            grouped("prefill", TP2, tensorParallelSize=16),
            role("decode", tensorParallelSize=8),
        ),
        "accepted",
        "",
    ),
    Shape(
        "4 nodes, TensorParallel 8 x pipelineParallelSize 4",
        both(
            grouped(
                "prefill",
                {"nodes": 4, "layout": "TensorParallel"},
                tensorParallelSize=8,
                pipelineParallelSize=4,
            ),
            role("decode", tensorParallelSize=8),
        ),
        "accepted",
        "",
    ),
    Shape(
        "--enable-eplb in an expert-parallel DataParallel group",
        grouped("decode", DP16_EP, extraArgs=["--enable-eplb"]),
        "accepted",
        "",
    ),
    Shape(
        "-dp 2 --enable-expert-parallel on a one-pod prefill beside a multi-node decode",
        both(
            role("prefill", extraArgs=["-dp", "2", "--enable-expert-parallel"]),
            grouped("decode", DP16_EP),
        ),
        "accepted",
        "",
    ),
    Shape(
        "--max-num-seqs in a multi-node role's extraArgs",
        grouped("decode", DP16_EP, extraArgs=["--max-num-seqs=64"]),
        "accepted",
        "",
    ),
]

REFUSED_BY = {
    "schema": "`kubectl apply`: the CRD's schema (core/v1)",
    "CEL": "`kubectl apply`: the CRD's CEL rule",
    "rule": "the webhook: pdmtp's own check (CEL cannot loop over the counts)",
    "webhook": "the webhook's dry run of the children",
    "accepted": "nothing: Kubernetes accepts it too",
}


def table() -> str:
    """docs/validation-corpus.md: this corpus's table, then tests/cluster/yaml_corpus.py's."""
    lines = [
        "<!-- Generated by tests/cluster/pod_corpus.py; tests/unit/test_pod_corpus.py checks "
        "it. -->",
        "",
        "# Admission corpus: pod fields and the spec's sense",
        "",
        "Each bad pod setting (issue 21) or spec that cannot work as written (issue 29), who "
        "refuses it, and the words every refusal contains; rows accepted by all draw the line. "
        "tests/cluster/test_pod_admission.py proves each row against a real API server "
        "(`kubectl apply --dry-run=server`, with and without the webhook; `pdmtp validate` "
        "and `pdmtp validate --server`). `pdmtp validate --server` refuses every row "
        "`pdmtp validate` refuses, and the webhook rows besides.",
        "",
        "| # | case | refused at admission by | `pdmtp validate` | `pdmtp validate --server` "
        "| words |",
        "|---|---|---|---|---|---|",
    ]
    for i, case in enumerate(CASES, start=1):
        refused_offline = case.layer in ("schema", "CEL", "rule")
        offline = "refused (exit 2)" if refused_offline else "accepted (exit 0)"
        server = "accepted (exit 0)" if case.layer == "accepted" else "refused (exit 2)"
        words = f"`{case.words}`" if case.words else ""
        lines.append(
            f"| {i} | {case.name} | {REFUSED_BY[case.layer]} | {offline} | {server} | {words} |"
        )
    # The YAML corpus (issue 29): what kubectl sends for each file, and what pdmtp validate reads.
    from cluster.yaml_corpus import table as yaml_table

    return "\n".join(lines) + "\n\n" + multi_node_table() + "\n" + yaml_table()


SHAPE_REFUSED_BY = {
    "schema": "the CRD's schema",
    "CEL": "the CRD's CEL rule",
    "owned": "the CRD's CEL rule (owned flags)",
    "accepted": "nothing: accepted",
}
SHAPE_VERDICT = {0: "accepted (exit 0)", 1: "incompatible (exit 1)", 2: "refused (exit 2)"}


def multi_node_table() -> str:
    lines = [
        "## Multi-node shapes (spec.<role>.multiNode)",
        "",
        "A role whose replica spans nodes: each shape it cannot take, refused at `kubectl apply` "
        "and by `pdmtp validate` in the same words, with the check of vLLM 0.33 it mirrors (the "
        "engine would refuse it at start-up, on every rank), and shapes that work. "
        "tests/unit/test_multinode_validation.py proves every row offline, "
        "tests/cluster/test_validation_corpus.py against a real API server (`kubectl apply "
        "--dry-run=server`).",
        "",
        "| # | shape | refused at admission by | `pdmtp validate` | words | vLLM 0.33 |",
        "|---|---|---|---|---|---|",
    ]
    for i, shape in enumerate(MULTI_NODE, start=1):
        words = f"`{shape.words}`" if shape.words else ""
        lines.append(
            f"| {i} | {shape.name} | {SHAPE_REFUSED_BY[shape.layer]} | "
            f"{SHAPE_VERDICT[shape.exit_code]} | {words} | {shape.vllm} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(table(), end="")

"""The admission corpus: bad pod settings (issue 21) and specs that parse but cannot work as
written (issue 29: autoscaling, the band's arithmetic, rendered objects, credentials in args, the
canary's budget), each with the layer that refuses it, and valid neighbours accepted by all.

`schema` and `CEL`: the CRD (Kubernetes' core/v1 schemas, list-map keys, our rules) refuses it at
`kubectl apply`, and `pdmtp validate` refuses it offline, both with `words`. `webhook`: only the
Deployment's own validation knows; `kubectl apply` stores it without the webhook, the webhook's
dry run of the children refuses it, and so does `pdmtp validate --server`; offline `pdmtp
validate` accepts it. `accepted`: Kubernetes accepts it too (shown so the line is drawn).

tests/cluster/test_pod_admission.py proves every row against a real API server;
tests/unit/test_pod_corpus.py keeps docs/validation-corpus.md equal to `table()`:

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


def doc(case: Case) -> Doc:
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

    return "\n".join(lines) + "\n\n" + yaml_table()


if __name__ == "__main__":
    print(table(), end="")

"""The pod-field corpus (issue 21): bad pod settings, each with the layer that refuses it.

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
    """schema, CEL, webhook or accepted."""
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

REFUSED_BY = {
    "schema": "`kubectl apply`: the CRD's schema (core/v1)",
    "CEL": "`kubectl apply`: the CRD's CEL rule",
    "webhook": "the webhook's dry run of the children",
    "accepted": "nothing: Kubernetes accepts it too",
}


def table() -> str:
    """docs/validation-corpus.md."""
    lines = [
        "<!-- Generated by tests/cluster/pod_corpus.py; tests/unit/test_pod_corpus.py checks "
        "it. -->",
        "",
        "# Pod-field admission corpus",
        "",
        "Each bad pod setting, who refuses it, and the words every refusal contains. "
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
        offline = "refused (exit 2)" if case.layer in ("schema", "CEL") else "accepted (exit 0)"
        server = "accepted (exit 0)" if case.layer == "accepted" else "refused (exit 2)"
        words = f"`{case.words}`" if case.words else ""
        lines.append(
            f"| {i} | {case.name} | {REFUSED_BY[case.layer]} | {offline} | {server} | {words} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(table(), end="")

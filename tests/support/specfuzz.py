"""Generated PDDeployment files for the fuzz (unit tier) and the differential test (cluster tier):
valid specs mutated one to four times, written as YAML or JSON text, sometimes with bytes spliced
in. Mutations: any node set to a boundary number or another type, a leaf written in a YAML
scalar form (`1:30`, `5e-2`, `0x1F`, `yes`, `!!binary ...`) or a JSON number form (`2.0`, `1e3`),
a key removed, a list item duplicated, an unknown key added; a role given a multi-node shape
(spec.<role>.multiNode, valid or not, with its parallel sizes and multi-node vLLM flags).

Every choice is a hypothesis draw, so a failing file shrinks to a small one.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from builders import pdd
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
Doc = dict[str, Any]
Path_ = tuple[str | int, ...]


def seeds() -> list[Doc]:
    """Valid specs to start from: the samples and a few builder shapes."""
    out: list[Doc] = []
    for sample in sorted((REPO / "samples").glob("*.yaml")):
        doc = yaml.safe_load(sample.read_text())
        doc["metadata"].pop("namespace", None)
        out.append(doc)
    autoscaled = pdd("fuzz").mtp(3, modules=3).dict()
    # Number fields with a fractional bound (the API server truncates such a bound for an integer
    # value, issue 52) sit under spec.autoscaling and spec.verification, which no sample sets.
    autoscaled["spec"]["autoscaling"] = {
        "prefill": {
            "minReplicas": 1,
            "maxReplicas": 4,
            "tolerance": 0.1,
            "targets": [{"signal": "waitingRequestsPerPod", "value": 4}],
        },
        "decode": {
            "minReplicas": 1,
            "maxReplicas": 8,
            "targets": [{"signal": "kvCacheUsage", "value": 0.8}],
        },
        "ratio": {"min": 0.25, "max": 2},
    }
    autoscaled["spec"]["verification"] = {
        "falseRollbackPercent": 1,
        "smallestRegressionPercent": 10,
    }
    out += [
        autoscaled,
        pdd("fuzz").dict(),
        pdd("fuzz").mtp(3, modules=3).dict(),
        pdd("fuzz").mtp(3, modules=3).prefill(replicas=2, tp=4).decode(replicas=3, tp=2).dict(),
        pdd("fuzz")
        .mtp(3, modules=3)
        .prefill(tp=8, multiNode={"nodes": 2, "layout": "TensorParallel"})
        .decode(
            tp=1,
            multiNode={
                "nodes": 2,
                "layout": "DataParallel",
                "dataParallelSize": 16,
                "expertParallel": True,
                "topologyKey": "topology.kubernetes.io/zone",
            },
        )
        .dict(),
    ]
    return out


SEEDS = seeds()
_SEED_JSON = [json.dumps(s) for s in SEEDS]  # json.loads is a fast deep copy

BOUNDARY: list[Any] = [
    0,
    1,
    -1,
    2,
    3,
    7,
    8,
    2**31 - 1,
    2**31,
    2**53,
    2**63 - 1,
    -(2**63),
    0.5,
    2.0,
    -0.0,
    1e-7,
    1e20,
    1.7976931348623157e308,
    True,
    False,
    None,
    "",
    " ",
    "x",
    "-",
    "a" * 64,
    "a" * 300,
    "2",
    "true",
    "null",
    "Ünïcode",
    "a\nb",
    "$(X)",
    "--flag",
    "/",
    "../x",
    "1Gi",
    "500m",
    "-1",
    [],
    {},
    ["x"],
    {"x": 1},
]
YAML_FORMS = [
    "1:30",
    "5e-2",
    "1e3",
    "1E3",
    ".5",
    "2.",
    "2.0",
    "+2",
    "0777",
    "0o17",
    "0x1F",
    "0b101",
    "08",
    "1_000",
    "yes",
    "no",
    "on",
    "off",
    "y",
    "n",
    "True",
    "NULL",
    "~",
    ".inf",
    "-.inf",
    ".nan",
    "2001-12-14",
    "2001-12-14t21:59:43.10-05:00",
    "!!binary aGVsbG8=",
    "!!binary /w==",
    "!!str 12",
    "!!int '3'",
    "!!float 2",
    "!!bool yes",
    "!thing x",
    "9223372036854775808",
    "99999999999999999999",
    "1e400",
    '"1:30"',
    "'0x1F'",
    "|\n  text",
    "[a, b]",
    "{a: 1}",
]
JSON_FORMS = ["2.0", "1e3", "1E0", "-0", "-0.0", "1e400", "9223372036854775808", "0.1e1", "3.00"]
UNKNOWN_KEYS = ["replica", "x", "status", "items", "Spec", "metadata"]
RAW = "RAWFORM"
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


@dataclass
class Spec:
    data: bytes
    notes: list[str]

    def show(self) -> str:
        text = self.data.decode("utf-8", errors="backslashreplace")
        return "mutations: " + "; ".join(self.notes) + "\n" + text


def nodes(value: Any, at: Path_ = ()) -> Iterator[Path_]:
    yield at
    if isinstance(value, dict):
        for k, v in value.items():
            yield from nodes(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from nodes(v, (*at, i))


def get(doc: Any, at: Path_) -> Any:
    for part in at:
        doc = doc[part]
    return doc


def swapped(value: Any, how: int) -> Any:
    """`value` as another type."""
    options = [str(value), [value], {"value": value}, None]
    if isinstance(value, int | float) and not isinstance(value, bool):
        options += [float(value), -value, value + 1, value * 1000]
    if isinstance(value, str):
        options += [value * 2, value.upper(), value + " ", len(value)]
    return options[how % len(options)]


OPS = ("set", "swap", "form", "remove", "duplicate", "unknown", "role", "multinode")

# spec.<role>.multiNode: values on both sides of every rule (nodes 2..64, a known layout,
# dataParallelSize only for DataParallel and a multiple of nodes, the GPUs of a pod, the flags
# a multi-node role leaves to the operator).
NODES = [1, 2, 3, 4, 8, 64, 65]
LAYOUTS = ["DataParallel", "TensorParallel", "Pipeline"]
DP_SIZES = [None, 1, 2, 4, 6, 8, 16, 128, 1025]
TOPOLOGY_KEYS = [None, "topology.kubernetes.io/zone", "rack", "bad key", ""]
GROUP_ARGS = [
    "--max-num-seqs=8",
    "--nnodes=2",
    "-n2",
    "--headless",
    "--data-parallel-size=4",
    "-dp",
    "--enable-expert-parallel",
    "--api-server-count=1",
    "--data-parallel-backend=ray",
    "--data-parallel-hybrid-lb",
    "-pcp",
    "--enable-eplb",
]


def multi_node(draw: st.DrawFn) -> Doc:
    shape: Doc = {
        "nodes": draw(st.sampled_from(NODES)),
        "layout": draw(st.sampled_from(LAYOUTS)),
    }
    size = draw(st.sampled_from(DP_SIZES))
    if size is not None:
        shape["dataParallelSize"] = size
    if draw(st.booleans()):
        shape["expertParallel"] = draw(st.booleans())
    key = draw(st.sampled_from(TOPOLOGY_KEYS))
    if key is not None:
        shape["topologyKey"] = key
    return shape


@st.composite
def specs(draw: st.DrawFn, allow_bytes: bool = True) -> Spec:
    doc = json.loads(_SEED_JSON[draw(st.integers(0, len(SEEDS) - 1))])
    paths = [p for p in nodes(doc) if p]
    as_json = draw(st.integers(0, 9)) == 0
    forms: list[str] = []
    notes: list[str] = []
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(OPS))
        if op == "role":  # a role-local setting the roles must agree on
            role = draw(st.sampled_from(["prefill", "decode"]))
            spec = doc.get("spec")
            if isinstance(spec, dict) and isinstance(spec.get(role), dict):
                if draw(st.booleans()):
                    k = draw(st.integers(1, 5))
                    spec[role]["speculative"] = {"numSpeculativeTokens": k}
                    notes.append(f"spec.{role}.speculative.numSpeculativeTokens = {k}")
                else:
                    tp = draw(st.sampled_from([1, 2, 3, 4, 8]))
                    spec[role]["tensorParallelSize"] = tp
                    notes.append(f"spec.{role}.tensorParallelSize = {tp}")
            continue
        if op == "multinode":  # a role spans nodes: its shape, sizes and flags together
            role = draw(st.sampled_from(["prefill", "decode"]))
            spec = doc.get("spec")
            if isinstance(spec, dict) and isinstance(spec.get(role), dict):
                shape = multi_node(draw)
                spec[role]["multiNode"] = shape
                notes.append(f"spec.{role}.multiNode = {shape}")
                for key, sizes in (
                    ("tensorParallelSize", [1, 2, 8]),
                    ("pipelineParallelSize", [1, 2, 4]),
                ):
                    if draw(st.booleans()):
                        spec[role][key] = draw(st.sampled_from(sizes))
                        notes.append(f"spec.{role}.{key} = {spec[role][key]}")
                if draw(st.integers(0, 2)) == 0:
                    arg = draw(st.sampled_from(GROUP_ARGS))
                    owner = spec.setdefault("engine", {}) if draw(st.booleans()) else spec[role]
                    if isinstance(owner, dict) and isinstance(owner.get("extraArgs", []), list):
                        owner.setdefault("extraArgs", []).append(arg)
                        notes.append(f"extraArgs += {arg!r}")
            continue
        at = paths[draw(st.integers(0, len(paths) - 1))]
        try:
            parent, last = get(doc, at[:-1]), at[-1]
            parent[last]  # an earlier mutation may have removed it
        except (KeyError, IndexError, TypeError):
            continue
        if not isinstance(parent, dict | list):
            continue  # an earlier mutation made it a string, which indexes but is immutable
        where = ".".join(map(str, at))
        if op == "set":
            value = draw(st.sampled_from(BOUNDARY))
            parent[last] = copy.deepcopy(value)
            notes.append(f"{where} = {value!r}")
        elif op == "swap":
            parent[last] = swapped(parent[last], draw(st.integers(0, 12)))
            notes.append(f"{where} swapped to {parent[last]!r}")
        elif op == "form":
            form = draw(st.sampled_from(JSON_FORMS if as_json else YAML_FORMS))
            parent[last] = f"{RAW}{len(forms)}"
            forms.append(form)
            notes.append(f"{where} written {form}")
        elif op == "remove":
            del parent[last]
            notes.append(f"{where} removed")
        elif op == "duplicate":
            if isinstance(parent, list):
                parent.insert(int(last), copy.deepcopy(parent[int(last)]))
                notes.append(f"{where} duplicated")
        elif isinstance(parent, dict):
            key = draw(st.sampled_from(UNKNOWN_KEYS))
            parent.setdefault(key, draw(st.sampled_from(BOUNDARY)))
            notes.append(f"{'.'.join(map(str, at[:-1]))}.{key} added")
    if as_json:
        text = json.dumps(doc, ensure_ascii=False, indent=1)
    else:
        text = yaml.dump(doc, Dumper=DUMPER, sort_keys=False, allow_unicode=True)
    for i, form in reversed(list(enumerate(forms))):
        placeholder = f'"{RAW}{i}"' if as_json else f"{RAW}{i}"
        if placeholder not in text:
            continue  # a later mutation removed it
        if "\n" in form:  # a block scalar: indent its body under the key
            line = next(x for x in text.splitlines() if placeholder in x)
            indent = " " * (len(line) - len(line.lstrip()) + 2)
            form = form.replace("\n  ", "\n" + indent)
        text = text.replace(placeholder, form)
    data = text.encode()
    if allow_bytes and draw(st.integers(0, 19)) == 0:
        at = draw(st.integers(0, len(data)))
        junk = draw(st.binary(min_size=1, max_size=8))
        data = data[:at] + junk + data[at:]
        notes.append(f"bytes {junk!r} at {at}")
    return Spec(data, notes)

"""Every spec field is classified compat, role-local or unhashed (`effective.FIELD_GROUPS`), and
behaves as classified: mutating it moves exactly the hashes its group says, and no pod template
changes unless the compat revision or that role's hash does."""

from __future__ import annotations

import copy
import functools
import os
import re
import shutil
import subprocess
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pdmtp.api.crd import openapi_schema
from pdmtp.api.v1alpha1 import PDDeployment, PDDeploymentSpec
from pdmtp.core.agreement import check
from pdmtp.core.effective import FIELD_GROUPS, FieldGroup
from pdmtp.core.render.children import engine_pod_template, router_deployment
from pdmtp.core.revision import hash_of, revision_of
from pydantic import BaseModel, ValidationError

REPO = Path(__file__).resolve().parents[2]
ROLES = ("prefill", "decode")
Path_ = tuple[str | int, ...]


# ---- the classification covers the model -----------------------------------------------------


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models a field's type holds (through Optional, Annotated, list, dict)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models_in(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType, list, dict, tuple):
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    return []


def _generic(path: str) -> str:
    head, _, rest = path.partition(".")
    return f"<role>.{rest}" if head in ROLES else path


def unclassified(model: type[BaseModel], groups: dict[str, str], prefix: str = "") -> list[str]:
    """Fields of `model` (recursively) under no classified path: a walk stops at a classified
    path; a field that is neither classified nor a structure of classified fields is reported."""
    missing = []
    for name, info in model.model_fields.items():
        path = prefix + (info.alias or name)
        if _generic(path) in groups:
            continue
        nested = _models_in(info.annotation)
        if not nested:
            missing.append(_generic(path))
        for sub in nested:
            missing += unclassified(sub, groups, path + ".")
    return sorted(set(missing))


def test_every_spec_field_is_classified() -> None:
    assert unclassified(PDDeploymentSpec, dict(FIELD_GROUPS)) == []


def test_every_classified_path_is_a_field() -> None:
    schema = openapi_schema()["properties"]["spec"]
    for path in FIELD_GROUPS:
        node = schema
        for part in path.replace("<role>", "prefill").split("."):
            node = node["properties"][part]


def test_a_field_added_without_a_group_fails(tmp_path: Path) -> None:
    """Red proof on a throwaway copy of the package: a new RoleSpec field nobody classified."""
    shutil.copytree(REPO / "operator" / "pdmtp", tmp_path / "pdmtp")
    module = tmp_path / "pdmtp" / "api" / "v1alpha1.py"
    anchor = '    """One engine role (prefill or decode)."""\n'
    text = module.read_text()
    assert anchor in text
    module.write_text(
        text.replace(anchor, anchor + '\n    surprise: int = Field(default=0, description="?")\n')
    )
    probe = (
        "from test_effective import unclassified\n"
        "from pdmtp.api.v1alpha1 import PDDeploymentSpec\n"
        "from pdmtp.core.effective import FIELD_GROUPS\n"
        "print(unclassified(PDDeploymentSpec, dict(FIELD_GROUPS)))\n"
    )
    paths = [tmp_path, Path(__file__).parent, REPO / "tests" / "support", REPO / "tests"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, paths))}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['<role>.surprise']"


# ---- each group behaves as classified -------------------------------------------------------

# Sets every classified path at least once (the samples leave many unset); a mutation of each of
# its leaves is checked like the samples' are.
EVERY_FIELD: dict[str, Any] = {
    "apiVersion": "pdmtp.io/v1alpha1",
    "kind": "PDDeployment",
    "metadata": {"name": "every", "namespace": "ns", "uid": "u-1"},
    "spec": {
        "model": {
            "name": "org/model",
            "revision": "main",
            "mtpModules": 1,
            "quantization": "fp8",
            "source": {"pvc": {"claimName": "weights", "subPath": "m", "readOnly": True}},
        },
        "image": "registry.example/pdmtp-engine:1",
        "engine": {
            "dtype": "auto",
            "kvCacheDtype": "auto",
            "blockSize": 16,
            "maxModelLen": 4096,
            "attentionBackend": "FLASH_ATTN",
            "disableHybridKVCacheManager": False,
            "stateBackoff": 0,
            "extraArgs": ["--trust-remote-code"],
        },
        "speculative": {"method": "mtp", "numSpeculativeTokens": 1, "draftModel": "org/draft"},
        "kvTransfer": {
            "protocol": "rdma",
            "deviceNames": ["mlx5_0"],
            "bootstrapPort": 8998,
            "loadFailurePolicy": "recompute",
        },
        "pod": {
            "priorityClassName": "high",
            "schedulerName": "default-scheduler",
            "serviceAccountName": "engine",
            "imagePullSecrets": [{"name": "reg"}],
            "terminationGracePeriodSeconds": 120,
        },
        "placement": {"topologyKey": "example.com/rack", "spreadKey": "kubernetes.io/hostname"},
        "prefill": {
            "replicas": 2,
            "tensorParallelSize": 2,
            "pipelineParallelSize": 1,
            "maxModelLen": 4096,
            "speculative": {"numSpeculativeTokens": 1},
            "resources": {"requests": {"cpu": "4"}, "limits": {"memory": "8Gi"}},
            "extraArgs": ["--max-num-seqs", "8"],
            "env": [{"name": "A", "value": "1"}],
            "envFrom": [{"secretRef": {"name": "s"}}],
            "nodeSelector": {"pool": "a"},
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "podAnnotations": {"a": "b"},
            "pod": {"schedulerName": "gang", "terminationGracePeriodSeconds": 60},
            "kvTransfer": {"deviceNames": ["mlx5_1"]},
        },
        "decode": {
            "replicas": 3,
            "tensorParallelSize": 2,
            "pipelineParallelSize": 1,
            "maxModelLen": 8192,
            "speculative": {"numSpeculativeTokens": 1},
            "resources": {"requests": {"cpu": "4"}},
            "extraArgs": ["--max-num-seqs", "64"],
            "env": [{"name": "B", "value": "2"}],
            "nodeSelector": {"pool": "b"},
            "podAnnotations": {"c": "d"},
            "kvTransfer": {"deviceNames": ["mlx5_2"]},
        },
        "router": {
            "replicas": 2,
            "policy": "round_robin",
            "image": "registry.example/router:1",
            "resources": {"requests": {"cpu": "100m"}},
        },
        "rollout": {
            "maxSurge": 1,
            "maxUnavailable": 0,
            "drainSeconds": 60,
            "progressDeadlineSeconds": 600,
            "onFailure": "Rollback",
            "paused": False,
            "canary": {"percent": 50, "autoPromote": False},
        },
        "verification": {
            "mode": "Gate",
            "minRequests": 8,
            "minDrafts": 32,
            "acceptanceTolerancePercent": 10,
            "falseRollbackPercent": 1,
            "smallestRegressionPercent": 10,
            "expectedAcceptanceLength": 1.5,
        },
        "autoscaling": {
            "prefill": {
                "minReplicas": 1,
                "maxReplicas": 4,
                "targets": [{"signal": "waitingRequestsPerPod", "value": 4}],
                "behavior": {"scaleUp": {"stabilizationWindowSeconds": 30, "maxPods": 2}},
                "tolerance": 0.1,
            },
            "decode": {"source": "External", "minReplicas": 2, "maxReplicas": 6},
            "ratio": {"min": 0.25, "max": 2},
            "intervalSeconds": 15,
            "staleAfterSeconds": 60,
        },
        "revisionHistoryLimit": 10,
    },
}
# A multi-node decode: its local settings join the compat revision (a group is never rolled in
# place), so a change to them moves the compat revision as well as the decode's hash.
MULTI_NODE = copy.deepcopy(EVERY_FIELD)
MULTI_NODE["metadata"]["name"] = "multi-node"
MULTI_NODE["spec"]["decode"]["multiNode"] = {
    "nodes": 2,
    "layout": "DataParallel",
    "dataParallelSize": 4,
    "expertParallel": False,
    "topologyKey": "example.com/rack",
}
SAMPLES = {p.stem: yaml.safe_load(p.read_text()) for p in sorted((REPO / "samples").glob("*.yaml"))}
SUBJECTS = {**SAMPLES, "every-field": EVERY_FIELD, "multi-node": MULTI_NODE}


def _leaves(value: Any, path: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    if isinstance(value, dict):
        for key, sub in value.items():
            yield from _leaves(sub, (*path, key))
    elif isinstance(value, list):
        for i, sub in enumerate(value):
            yield from _leaves(sub, (*path, i))
    else:
        yield path, value


@functools.cache
def _spec_schema() -> dict[str, Any]:
    schema: dict[str, Any] = openapi_schema()["properties"]["spec"]
    return schema


def _schema_at(path: Path_) -> dict[str, Any]:
    node = _spec_schema()
    for part in path:
        if isinstance(part, int):
            node = node.get("items", {})
        elif "properties" in node and part in node["properties"]:
            node = node["properties"][part]
        else:
            node = node.get("additionalProperties") or {}
    return node


def _candidates(path: Path_, value: Any) -> list[Any]:
    """Other values for a leaf, most likely valid first."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, value - 1, value * 2]
    enum = _schema_at(path).get("enum")
    if enum:
        return [e for e in enum if e != value]
    quantity = re.fullmatch(r"(\d+)(\D*)", str(value))
    out: list[Any] = [f"{int(quantity[1]) + 1}{quantity[2]}"] if quantity else []
    return [*out, f"{value}x", f"{value}-x"]


def _classify(path: Path_) -> tuple[str, FieldGroup]:
    wire = ".".join(p for p in path if isinstance(p, str))
    generic = _generic(wire)
    for key in sorted(FIELD_GROUPS, key=len, reverse=True):
        if generic == key or generic.startswith(key + "."):
            return key, FIELD_GROUPS[key]
    raise AssertionError(f"{wire} is classified nowhere")


def _set(doc: dict[str, Any], path: Path_, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node: Any = out["spec"]
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return out


def _observe(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The hashes and rendered templates of a compatible spec; None if it is refused."""
    try:
        pdd = PDDeployment.model_validate(doc)
    except ValidationError:
        return None
    agreement = check(pdd.spec)
    if not agreement.compatible:
        return None
    eff = agreement.settings
    revision = revision_of(eff)
    seen: dict[str, Any] = {"compat": revision}
    for role in ROLES:
        seen[f"hash.{role}"] = hash_of(eff, role)  # type: ignore[arg-type]
        seen[f"template.{role}"] = engine_pod_template(pdd, revision, role, agreement)  # type: ignore[arg-type]
    seen["hash.router"] = hash_of(eff, "router")
    router = router_deployment(pdd, eff, revision, 1, None)
    seen["template.router"] = router["spec"]["template"]
    return seen


def _mutations() -> Iterator[tuple[str, Path_, dict[str, Any], dict[str, Any]]]:
    """(subject, leaf path, base observation, mutated observation) for each accepted mutation."""
    for subject, doc in SUBJECTS.items():
        base = _observe(doc)
        assert base is not None, f"{subject} must be a compatible spec"
        for path, value in _leaves(doc["spec"]):
            for candidate in _candidates(path, value):
                mutated = _observe(_set(doc, path, candidate))
                if mutated is not None:
                    yield subject, path, base, mutated
                    break


MUTATIONS = list(_mutations())


def _moved(base: dict[str, Any], mutated: dict[str, Any], key: str) -> bool:
    return bool(base[key] != mutated[key])


def test_the_mutations_cover_every_classified_path() -> None:
    covered = {_classify(path)[0] for _, path, _, _ in MUTATIONS}
    assert covered == set(FIELD_GROUPS), sorted(set(FIELD_GROUPS) - covered)
    assert len(MUTATIONS) > 100


@pytest.mark.parametrize(
    ("subject", "path", "base", "mutated"),
    MUTATIONS,
    ids=[f"{s}:{'.'.join(map(str, p))}" for s, p, _, _ in MUTATIONS],
)
def test_a_mutation_moves_what_its_group_says(
    subject: str, path: Path_, base: dict[str, Any], mutated: dict[str, Any]
) -> None:
    key, group = _classify(path)
    moved = {
        k
        for k in ("compat", "hash.prefill", "hash.decode", "hash.router")
        if _moved(base, mutated, k)
    }
    grouped = {r for r in ROLES if "multiNode" in SUBJECTS[subject]["spec"][r]}
    if group == "compat":
        assert "compat" in moved
    elif group == "unhashed":
        assert moved == set()
    elif key.startswith("<role>."):
        assert moved - {"compat"} == {f"hash.{path[0]}"}
        assert ("compat" in moved) == (path[0] in grouped)
    elif key.startswith("router."):
        assert moved == {"hash.router"}
    else:  # spec.pod and spec.placement: both engine roles' pod settings
        assert moved and moved - {"compat"} <= {"hash.prefill", "hash.decode"}
        grouped_moved = {f"hash.{r}" for r in grouped} & moved
        assert ("compat" in moved) == bool(grouped_moved)
    # No pod is replaced unless a hash says so: the Deployment controller would roll it outside
    # the paired rollout and its invariants.
    for role in (*ROLES, "router"):
        if _moved(base, mutated, f"template.{role}"):
            assert moved & {"compat", f"hash.{role}"}, f"{role} template changed, no hash moved"

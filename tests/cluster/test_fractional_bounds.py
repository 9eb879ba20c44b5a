"""`pdmtp validate` and the API server agree on numbers at and around fractional bounds (issue 52).

The API server checks an integer value against a `minimum` truncated towards zero, so before the
CRD repeated such bounds as CEL (`pdmtp.api.crd._bounded_as_doubles`) it stored
`spec.autoscaling.ratio.min: 0` that `pdmtp validate` refuses. The fields are listed from the CRD
itself, so a new number field with a fractional bound is covered without being named here: it
only has to be reachable in BASE (the test fails until it is).
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import pdd
from cluster.kubehelpers import Cluster, kubectl
from pdmtp.cli import main

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "pdmtp.io_pddeployments.yaml"
Path_ = tuple[str | int, ...]

_TARGETS = {"minReplicas": 1, "maxReplicas": 4, "tolerance": 0.1}
BASE: dict[str, Any] = pdd("bounds").mtp(3, modules=3).dict()
"""A valid spec that reaches every number field with a fractional bound (one list item each)."""
BASE["spec"]["autoscaling"] = {
    "prefill": {**_TARGETS, "targets": [{"signal": "waitingRequestsPerPod", "value": 4}]},
    "decode": {**_TARGETS, "targets": [{"signal": "kvCacheUsage", "value": 0.8}]},
    "ratio": {"min": 0.25, "max": 2},
}
BASE["spec"]["verification"] = {"falseRollbackPercent": 1}


def fractional_bounds(schema: dict[str, Any], at: Path_ = ()) -> Iterator[tuple[Path_, float]]:
    """(path, bound) of every number field whose minimum or maximum is not an integer."""
    if schema.get("type") == "number":
        for key in ("minimum", "maximum"):
            bound = schema.get(key)
            if bound is not None and not float(bound).is_integer():
                yield at, float(bound)
    for name, sub in (schema.get("properties") or {}).items():
        yield from fractional_bounds(sub, (*at, name))
    if "items" in schema:
        yield from fractional_bounds(schema["items"], (*at, 0))


def _schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    spec: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    return spec["spec"]


FIELDS = sorted(set(fractional_bounds(_schema(), ("spec",))))


def scalars(bound: float) -> list[str]:
    """YAML scalars to try: 0 and 1 as integers and floats, the bound, and the integers and
    halves around it."""
    low, high = math.floor(bound), math.ceil(bound)
    forms = ["0", "0.0", "1", "1.0", repr(bound), str(low), str(high), f"{low}.0", f"{high}.0"]
    forms += [repr(bound / 2), repr(bound * 2), repr(-bound)]
    return list(dict.fromkeys(forms))


def with_scalar(path: Path_, scalar: str) -> str:
    """BASE as YAML with the field at `path` written as exactly `scalar`."""
    doc = copy.deepcopy(BASE)
    parent: Any = doc
    for part in path[:-1]:
        parent = parent[part]
    marker = "__PDMTP_SCALAR__"
    parent[path[-1]] = marker
    return (
        yaml.safe_dump(doc, sort_keys=False).replace(f"'{marker}'", scalar).replace(marker, scalar)
    )


def test_the_crd_lists_fields_with_fractional_bounds() -> None:
    """The fields this test exists for are still there (an empty list would prove nothing)."""
    paths = {".".join(map(str, p)) for p, _ in FIELDS}
    assert "spec.autoscaling.ratio.min" in paths, paths
    assert "spec.autoscaling.prefill.targets.0.value" in paths, paths


@pytest.mark.parametrize(
    ("path", "bound"), [pytest.param(p, b, id=f"{'.'.join(map(str, p))}={b}") for p, b in FIELDS]
)
def test_validate_and_the_api_server_agree_around_a_fractional_bound(
    cluster: Cluster, crd: None, namespace: str, tmp_path: Path, path: Path_, bound: float
) -> None:
    parent: Any = BASE
    for part in path[:-1]:
        assert isinstance(parent, dict | list), path
        parent = parent[part] if isinstance(parent, list) or part in parent else None
        assert parent is not None, f"add {'.'.join(map(str, path))} to BASE"
    file = tmp_path / "spec.yaml"
    disagreements, verdicts = [], []
    for scalar in scalars(bound):
        file.write_text(with_scalar(path, scalar))
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            offline = main(["validate", str(file)])
        applied = kubectl(
            cluster,
            "-n",
            namespace,
            "apply",
            "--dry-run=server",
            "--validate=strict",
            "-f",
            str(file),
        )
        server = applied.returncode == 0
        verdicts.append(f"{scalar}: {'accepted' if offline == 0 else 'refused'}")
        if (offline == 0) != server:
            said = (applied.stdout + applied.stderr).strip()
            disagreements.append(
                f"{scalar}: pdmtp validate exits {offline}, the API server "
                f"{'accepts' if server else 'refuses'} ({said})"
            )
    print(".".join(map(str, path)), verdicts)
    assert not disagreements, disagreements
    # Both verdicts came up (a field the spec ignored would accept everything).
    assert any(v.endswith("accepted") for v in verdicts), verdicts
    assert any(v.endswith("refused") for v in verdicts), verdicts

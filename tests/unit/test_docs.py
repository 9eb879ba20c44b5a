"""docs/api-reference.md is generated from the CRD, committed, complete and free of drift."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pdmtp.api import reasons
from pdmtp.api.crd import PRINTER_COLUMNS, openapi_schema
from pdmtp.api.rules import CEL_KEY
from pdmtp.tools.reference import documented_type, field_reference

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "api-reference.md"


def field_paths(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every named field below `schema`, as the reference spells it (`a.b[].c`)."""
    for name, sub in schema.get("properties", {}).items():
        sub_path = f"{path}.{name}" if path else name
        yield sub_path, sub
        yield from field_paths(sub, sub_path)
        if isinstance(sub.get("items"), dict):
            yield from field_paths(sub["items"], f"{sub_path}[]")


@pytest.fixture(scope="module")
def reference() -> str:
    return field_reference()


def row(reference: str, path: str) -> list[str]:
    """The table cells of one field's row: field, type, required, default, constraints, text."""
    prefix = f"| `{path}` |"
    (line,) = [line for line in reference.splitlines() if line.startswith(prefix)]
    return [cell.strip() for cell in line.strip("|").split(" | ")]


def test_committed_reference_matches_the_model(reference: str) -> None:
    assert COMMITTED.read_text() == reference, "docs/ drifted: run `make generate` and commit"


def test_output_is_deterministic(reference: str) -> None:
    assert field_reference() == reference
    assert reference.endswith("\n") and not reference.endswith("\n\n")
    assert "Do not edit" in reference.splitlines()[0]


def test_every_spec_and_status_field_has_a_row(reference: str) -> None:
    schema = openapi_schema(embed=False)  # core/v1 fields are named, not spelled out
    paths = [p for p, _ in field_paths(schema) if p.startswith(("spec.", "status."))]
    assert "spec.prefill.env[].name" in paths  # the walk reaches list items
    for path in paths:
        assert row(reference, path), path


def test_known_field_shows_its_default_bounds_and_description(reference: str) -> None:
    field, kind, required, default, bounds, text = row(reference, "spec.rollout.drainSeconds")
    assert (field, kind, required, default) == (
        "`spec.rollout.drainSeconds`",
        "integer",
        "no",
        "`60`",
    )
    assert bounds == "min 0; max 3600"
    assert text.startswith("Seconds an old revision keeps its pods")

    cells = row(reference, "spec.engine.blockSize")
    assert cells[3] == "`16`" and "one of `8`, `16`, `32`, `64`, `128`" in cells[4]
    assert row(reference, "spec.model.name")[2] == "yes"
    assert row(reference, "spec.prefill.env")[1] == "list of object"
    assert row(reference, "spec.prefill.resources.requests")[1] == (
        "map of string to int-or-string"
    )
    assert "list-map keyed by `type`" in row(reference, "status.conditions")[4]


def test_every_cel_rule_and_message_is_listed(reference: str) -> None:
    def rules(node: dict[str, Any]) -> Iterator[dict[str, str]]:
        yield from node.get(CEL_KEY, [])
        for sub in node.get("properties", {}).values():
            yield from rules(sub)
        if isinstance(node.get("items"), dict):
            yield from rules(node["items"])

    found = list(rules(openapi_schema()))
    assert len(found) >= 7
    for rule in found:
        assert f"  {rule['rule']}\n" in reference, rule["rule"]
        assert rule["message"] in reference, rule["message"]


def test_printer_columns_condition_types_and_every_reason(reference: str) -> None:
    for column in PRINTER_COLUMNS:
        assert f"| {column['name']} | {column['type']} |" in reference
    for ctype in reasons.CONDITION_TYPES:
        assert f"### `{ctype}`" in reference
    constants = [
        value
        for name, value in vars(reasons).items()
        if name.isupper()
        and not name.startswith("_")  # the module's own phrases, shared by several reasons
        and isinstance(value, str)
        and value not in (*reasons.CONDITION_TYPES, reasons.EVENT)
    ]
    registered = [r.name for r in reasons.REASONS]
    assert sorted(registered) == sorted(constants), "a reason constant is not in the table"
    assert len(set(registered)) == len(registered), "a reason is registered twice"
    for r in reasons.REASONS:
        assert f"| `{r.name}` | {r.meaning} |" in reference


def test_reasons_documented_under_their_condition_type(reference: str) -> None:
    def section(title: str) -> str:
        start = reference.index(title)
        return reference[start : reference.index("\n## ", start + 1)]

    assert f"`{reasons.LOOKAHEAD_MISMATCH}`" in section("### `ConfigCompatible`")
    assert f"`{reasons.ROLLOUT_BLOCKED}`" in section("### `Progressing`")
    assert f"`{reasons.ENGINE_REFUSED_CONFIG}`" in section("### `Degraded`")
    assert f"`{reasons.TRAFFIC_STOPPED}`" in section("## Events")
    assert f"`{reasons.TRAFFIC_STOPPED}`" not in section("### `Progressing`")


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        ({"type": "array", "items": {"type": "string"}}, "list of string"),
        ({"type": "object", "additionalProperties": {"type": "string"}}, "map of string to string"),
        ({"x-kubernetes-int-or-string": True}, "int-or-string"),
        ({"type": "object", "x-kubernetes-preserve-unknown-fields": True}, "object (free-form)"),
        ({"type": "boolean"}, "boolean"),
    ],
)
def test_type_names(node: dict[str, Any], expected: str) -> None:
    assert documented_type(node) == expected

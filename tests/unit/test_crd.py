"""The CRD is generated from the model, structural, committed, and free of drift."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pdmtp.api.crd import crd, crd_yaml, openapi_schema
from pdmtp.api.flags import OWNED_FLAGS

COMMITTED = Path(__file__).resolve().parents[2] / "crds" / "pdmtp.io_pddeployments.yaml"


def walk(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from walk(sub, f"{path}.{name}")
    if "items" in schema:
        yield from walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}{{}}")


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    version = crd()["spec"]["versions"][0]
    root: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return root


def test_committed_crd_matches_the_model() -> None:
    assert COMMITTED.read_text() == crd_yaml(), "crds/ drifted: run `make generate` and commit"


def test_schema_is_structural(schema: dict[str, Any]) -> None:
    for path, node in walk(schema):
        assert "$ref" not in node, path
        assert "anyOf" not in node and "oneOf" not in node and "allOf" not in node, path
        assert "title" not in node and "const" not in node, path
        if "properties" in node:
            assert "additionalProperties" not in node, path
        is_int_or_string = node.get("x-kubernetes-int-or-string") is True
        preserves = node.get("x-kubernetes-preserve-unknown-fields") is True
        assert "type" in node or is_int_or_string or preserves, f"{path} has no type"


def test_every_spec_and_status_field_is_described() -> None:
    # Our own fields; the embedded core/v1 schemas carry no descriptions (the CRD's size).
    schema = openapi_schema(embed=False)
    for top in ("spec", "status"):
        for path, node in walk(schema["properties"][top], top):
            if path.endswith(("[]", "{}")):
                continue  # list items and map values are described by their field
            assert node.get("description"), f"{path} has no description"


def test_status_subresource_printer_columns_and_no_scale() -> None:
    version = crd()["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert {"Ready", "Prefill", "Decode", "Lookahead", "Revision", "Age"} <= set(columns)
    assert columns["Ready"] == '.status.conditions[?(@.type=="Available")].status'
    names = crd()["spec"]["names"]
    assert names["shortNames"] == ["pdd"] and names["plural"] == "pddeployments"


def test_cel_rules_carry_messages_that_name_the_field(schema: dict[str, Any]) -> None:
    rules = [
        (path, rule)
        for path, node in walk(schema)
        for rule in node.get("x-kubernetes-validations", [])
    ]
    assert len(rules) >= 20
    for path, rule in rules:
        field = path.rstrip("[]").rsplit(".", 1)[-1].rstrip("s")
        named = ("spec." in rule["message"] or "metadata." in rule["message"]) or (
            field.lower() in rule["message"].lower()
        )
        # The object a root or object-level rule sits on is named by its path instead.
        assert named or field in ("", "rollout", "kvTransfer"), (path, rule["message"])


def test_every_cel_rule_has_a_python_twin() -> None:
    """Each rule the API server enforces is enforced offline too: by pydantic, or by the
    agreement under a named reason (pdmtp validate then exits 1 instead of 2)."""
    import pdmtp.api.pod as pod
    import pdmtp.api.v1alpha1 as model
    from pdmtp.api import reasons
    from pdmtp.api.base import Model
    from pdmtp.api.rules import Rule

    found: list[Rule] = []
    for module in (model, pod):
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, Model):
                found += value.RULES
            elif isinstance(value, Rule):
                found.append(value)
    assert found
    compatible = [r.name for r in reasons.REASONS if r.belongs_to == reasons.CONFIG_COMPATIBLE]
    for rule in found:
        assert rule.holds is not None or rule.finding in compatible, rule.message


def test_extra_args_rule_lists_every_owned_long_flag(schema: dict[str, Any]) -> None:
    role = schema["properties"]["spec"]["properties"]["prefill"]["properties"]["extraArgs"]
    (rule,) = role["x-kubernetes-validations"]
    for flag in OWNED_FLAGS:
        stem = flag[2:].replace("-", "[-_]") if flag.startswith("--") else flag
        assert stem in rule["rule"], flag


def test_lists_and_strings_are_bounded_for_cel_cost(schema: dict[str, Any]) -> None:
    spec = schema["properties"]["spec"]
    for path, node in walk(spec, "spec"):
        if node.get("type") == "array" and node.get("x-kubernetes-validations"):
            assert "maxItems" in node, path
            assert "maxLength" in node["items"] or node["items"].get("type") == "object", path


def test_crd_yaml_round_trips() -> None:
    assert yaml.safe_load(crd_yaml()) == crd()

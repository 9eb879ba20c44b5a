"""Kubernetes' own core/v1 schemas for the free-form pod fields, checked twice from one source.

`corev1.json` is a trimmed snapshot of the API server's OpenAPI v3 (`/openapi/v3/api/v1`) at the
pinned Kubernetes version, taken by hack/corev1-snapshot.py. `CoreV1("PodSpec.volumes")` on a
field does two things with it:

- the CRD embeds the schema inlined into structural form (no `$ref`, int-or-string quantities,
  list-map keys kept), as kubebuilder embeds core types, so the API server refuses type errors,
  bad enum values and duplicate list-map keys at admission;
- `pdmtp validate` (and the operator) checks a value against the same schema with `problems()`,
  a validator for the subset of OpenAPI the snapshot uses, in the API server's words: `Required
  value`, `Unsupported value`, `Duplicate value`, `unknown field`.

What the schema cannot say (a volume with no source, a mount of a volume that does not exist) is
checked by the rules beside the fields; what only the Deployment's own validation knows is left to
the webhook's dry run (pdmtp.admission). Pure: no client, no I/O beyond reading the snapshot.
"""

from __future__ import annotations

import copy
import json
import re
from functools import cache
from importlib import resources
from typing import Any, Final

from pydantic import BaseModel, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from pdmtp.api.rules import CEL_KEY, QUANTITY

JsonSchema = dict[str, Any]

MARKER: Final = "x-pdmtp-corev1"
"""Key of the placeholder the model's JSON schema carries; the CRD renderer swaps in the schema."""
SCHEMA_ERROR: Final = "pdmtp_corev1"
"""pydantic error type of a schema problem: its ctx holds the (relative path, message) pairs."""
QUANTITY_REF: Final = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_INT_RANGES: Final = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


@cache
def snapshot() -> dict[str, Any]:
    text = resources.files("pdmtp.api").joinpath("corev1.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def _inline(node: Any, definitions: dict[str, Any], seen: tuple[str, ...]) -> Any:
    if isinstance(node, list):
        return [_inline(n, definitions, seen) for n in node]
    if not isinstance(node, dict):
        return node
    if "allOf" in node and len(node["allOf"]) == 1:
        node = {**{k: val for k, val in node.items() if k != "allOf"}, **node["allOf"][0]}
    if "$ref" in node:
        ref = node["$ref"]
        rest = {k: val for k, val in node.items() if k != "$ref"}
        if ref == QUANTITY_REF:
            # As kubebuilder writes resource.Quantity: int-or-string, strings in its grammar.
            return {**rest, "x-kubernetes-int-or-string": True, "pattern": QUANTITY}
        if ref in seen:
            raise ValueError(f"recursive core/v1 schema through {ref}: cannot inline it")
        return {**_inline(definitions[ref], definitions, (*seen, ref)), **rest}
    if "oneOf" in node:
        raise ValueError(f"cannot express oneOf {node['oneOf']} structurally")
    out: JsonSchema = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: _inline(sub, definitions, seen) for name, sub in value.items()}
        else:
            out[key] = _inline(value, definitions, seen)
    return out


@cache
def _schema(field: str) -> JsonSchema:
    snap = snapshot()
    try:
        raw = snap["fields"][field]
    except KeyError:
        raise KeyError(
            f"{field} is not in the core/v1 snapshot: add it to hack/corev1-snapshot.py's FIELDS "
            "and refresh the snapshot"
        ) from None
    inlined: JsonSchema = _inline(raw, snap["definitions"], ())
    return inlined


def schema(field: str) -> JsonSchema:
    """The structural schema of `PodSpec.<field>` or `Container.<field>` (a fresh copy)."""
    return copy.deepcopy(_schema(field))


def type_name(field: str) -> str:
    """A reader's name for the field's type: `core/v1 Affinity`, `list of core/v1 Volume`."""
    raw = snapshot()["fields"][field]
    if raw.get("type") == "array":
        return "list of " + _ref_name(raw["items"])
    return _ref_name(raw)


def _ref_name(node: JsonSchema) -> str:
    ref = node.get("$ref") or next((o["$ref"] for o in node.get("allOf", []) if "$ref" in o), "")
    return f"core/v1 {ref.rsplit('.', 1)[-1]}"


# ---- the validator ------------------------------------------------------------------------------

SchemaProblem = tuple[str, str]
"""(path relative to the checked value, e.g. `[1].name`, what is wrong)."""


def _show(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=repr)[:80]


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return True


def problems(value: Any, node: JsonSchema, path: str = "") -> list[SchemaProblem]:
    """Every way `value` breaks the structural schema `node` (empty: it conforms)."""
    out: list[SchemaProblem] = []
    if node.get("x-kubernetes-int-or-string"):
        if isinstance(value, bool) or not isinstance(value, int | str):
            return [(path, f"Invalid value: {_show(value)}: must be an integer or a string")]
        # fullmatch: the schema's pattern is a Go regexp, whose $ never matches before a final \n
        pattern = node.get("pattern")
        if isinstance(value, str) and pattern and not re.fullmatch(pattern, value):
            return [(path, f"Invalid value: {_show(value)}: must be a quantity such as 4, 500m")]
        return []
    kind = node.get("type")
    if kind is not None and not _type_ok(value, kind):
        article = "an" if kind[0] in "aeiou" else "a"
        return [(path, f"Invalid value: {_show(value)}: must be {article} {kind}")]
    if "enum" in node and value not in node["enum"]:
        supported = ", ".join(_show(e) for e in node["enum"])
        out.append((path, f"Unsupported value: {_show(value)}: supported values: {supported}"))
    if kind == "integer" and node.get("format") in _INT_RANGES:
        low, high = _INT_RANGES[node["format"]]
        if not low <= value <= high:
            out.append((path, f"Invalid value: {value}: out of range for {node['format']}"))
    if isinstance(value, dict):
        props: dict[str, JsonSchema] = node.get("properties", {})
        for name in node.get("required", []):
            if name not in value:
                out.append((f"{path}.{name}", "Required value"))
        extra = node.get("additionalProperties")
        for name, sub in value.items():
            where = f"{path}.{name}"
            if name in props:
                out += problems(sub, props[name], where)
            elif isinstance(extra, dict):
                out += problems(sub, extra, f"{path}[{_show(name)}]")
            elif props and not node.get("x-kubernetes-preserve-unknown-fields"):
                out.append((where, "unknown field"))
    if isinstance(value, list):
        items = node.get("items", {})
        for i, item in enumerate(value):
            out += problems(item, items, f"{path}[{i}]")
        out += _duplicates(value, node, path)
    return out


def _duplicates(value: list[Any], node: JsonSchema, path: str) -> list[SchemaProblem]:
    list_type = node.get("x-kubernetes-list-type")
    keys: list[str] = node.get("x-kubernetes-list-map-keys", [])
    seen: set[str] = set()
    out: list[SchemaProblem] = []
    for i, item in enumerate(value):
        if list_type == "map" and isinstance(item, dict):
            if any(k not in item for k in keys):
                continue  # reported as a required key already
            key = {k: item[k] for k in keys}
            shown = _show(key[keys[0]]) if len(keys) == 1 else _show(key)
        elif list_type == "set":
            key, shown = item, _show(item)
        else:
            return []
        canonical = json.dumps(key, sort_keys=True, default=repr)
        if canonical in seen:
            out.append((f"{path}[{i}]", f"Duplicate value: {shown}"))
        seen.add(canonical)
    return out


def raise_problems(found: list[SchemaProblem]) -> None:
    if found:
        lines = "; ".join(f"{where}: {what}" for where, what in found)
        raise PydanticCustomError(SCHEMA_ERROR, lines, {"problems": found})


class CoreV1:
    """Annotated metadata: the field has the core/v1 schema of `field` (`PodSpec.volumes`), in
    the CRD and in the check that runs before the field's own type."""

    def __init__(self, field: str, refine: type[BaseModel] | None = None) -> None:
        self.field = field
        self.refine = refine
        """Our model of the field's objects (list items): its own bounds and CEL rules are laid
        over Kubernetes' schema in the CRD, as the model checks them here."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        def check(value: Any) -> Any:
            if isinstance(value, list | dict):  # other types: the field's own type says so
                raise_problems(problems(_plain(value), _schema(self.field)))
            return value

        return core_schema.no_info_before_validator_function(check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        out: JsonSchema = {MARKER: self.field}
        if self.refine is not None:
            out[REFINE] = refinements(self.refine)
        return out


REFINE: Final = "x-pdmtp-refine"
_REFINED_KEYS: Final = ("minLength", "maxLength", "pattern", CEL_KEY)


def refinements(model: type[BaseModel]) -> JsonSchema:
    """The bounds and CEL rules `model` adds to the core/v1 object it models."""
    own = model.model_json_schema(by_alias=True, mode="validation")
    properties: JsonSchema = {}
    for name, sub in own.get("properties", {}).items():
        picked = {k: sub[k] for k in _REFINED_KEYS if k in sub}
        if picked:
            properties[name] = picked
    out: JsonSchema = {"properties": properties}
    if CEL_KEY in own:
        out[CEL_KEY] = own[CEL_KEY]
    return out


def _plain(value: Any) -> Any:
    """Models (a spec built in Python) as the wire form the schema describes."""
    if isinstance(value, BaseModel):
        return value.model_dump(by_alias=True, exclude_none=True, mode="json")
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


class ListMap:
    """Annotated metadata for a list of our own models: a list-map keyed by `keys` (duplicates
    refused here and by the API server)."""

    def __init__(self, *keys: str) -> None:
        self.keys = keys

    def _node(self) -> JsonSchema:
        return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": list(self.keys)}

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        def check(value: Any) -> Any:
            if isinstance(value, list):
                raise_problems(_duplicates(_plain(value), self._node(), ""))
            return value

        return core_schema.no_info_before_validator_function(check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        json_schema.update(self._node())
        return json_schema

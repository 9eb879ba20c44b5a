"""Render the PDDeployment CustomResourceDefinition from the pydantic model.

pydantic emits JSON Schema; apiextensions.k8s.io/v1 wants a *structural* OpenAPI v3 schema. This
module rewrites one into the other (inline `$ref`, nullable instead of `anyOf [T, null]`,
int-or-string, no titles, no `additionalProperties: false`) and adds what JSON Schema cannot say:
printer columns, the status subresource, list-map keys and the root-level CEL rules.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel

from pdmtp.api import corev1
from pdmtp.api import vocabulary as v
from pdmtp.api.corev1 import JsonSchema
from pdmtp.api.rolescale import PDRoleScale
from pdmtp.api.rules import CEL_KEY
from pdmtp.api.v1alpha1 import METADATA_NAME, PDDeployment

DOCS_TYPE = "x-pdmtp-type"
"""The type name of a core/v1 stand-in (openapi_schema(embed=False) only; never in the CRD)."""

_DROPPED_KEYS = frozenset({"title", "discriminator", "examples"})

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Available")].status',
        "description": "Available condition: a revision serves with enough ready pods.",
    },
    {
        "name": "Prefill",
        "type": "string",
        "jsonPath": ".status.prefill",
        "description": "Ready/desired prefill replicas (pods, or whole groups if multi-node).",
    },
    {
        "name": "Decode",
        "type": "string",
        "jsonPath": ".status.decode",
        "description": "Ready/desired decode replicas (pods, or whole groups if multi-node).",
    },
    {
        "name": "Lookahead",
        "type": "integer",
        "jsonPath": ".status.lookahead.decode",
        "description": "MTP prefill lookahead both roles derive.",
    },
    {
        "name": "Revision",
        "type": "string",
        "jsonPath": ".status.currentRevision",
        "description": "The most established serving revision.",
    },
    {
        "name": "Update",
        "type": "string",
        "jsonPath": ".status.updateRevision",
        "priority": 1,
        "description": "The revision the spec asks for.",
    },
    {
        "name": "Compatible",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="ConfigCompatible")].status',
        "priority": 1,
        "description": "ConfigCompatible condition.",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _is_null(schema: JsonSchema) -> bool:
    return schema.get("type") == "null"


def _embedded(schema: JsonSchema, embed: bool) -> JsonSchema:
    """A core/v1 field (pdmtp.api.corev1.CoreV1): Kubernetes' schema, inlined, with our own
    bounds and rules laid over its objects; or, for the field reference, a named stand-in."""
    field = schema[corev1.MARKER]
    rest = {
        k: val
        for k, val in schema.items()
        if k not in (corev1.MARKER, corev1.REFINE) and k not in _DROPPED_KEYS
    }
    refine = schema.get(corev1.REFINE) or {}
    if not embed:
        kind = "array" if corev1.type_name(field).startswith("list") else "object"
        rules = [
            *refine.get(CEL_KEY, []),
            *(
                rule
                for sub in refine.get("properties", {}).values()
                for rule in sub.get(CEL_KEY, [])
            ),
        ]
        return {"type": kind, DOCS_TYPE: corev1.type_name(field), **rest, CEL_KEY: rules}
    out = corev1.schema(field)
    if refine:
        target = out["items"] if out.get("type") == "array" else out
        for name, extra in refine["properties"].items():
            target["properties"][name].update(extra)
        if CEL_KEY in refine:
            target[CEL_KEY] = refine[CEL_KEY]
    return {**out, **rest}


def _structural(schema: JsonSchema, defs: dict[str, JsonSchema], embed: bool = True) -> JsonSchema:
    """Rewrite one JSON Schema node (recursively) into its structural form."""
    if corev1.MARKER in schema:
        return _embedded(schema, embed)
    if "$ref" in schema:
        target = defs[schema["$ref"].rsplit("/", 1)[-1]]
        # Keys beside $ref (description, CEL rules of the field) override the definition's.
        merged = {**target, **{k: val for k, val in schema.items() if k != "$ref"}}
        target_rules = target.get(CEL_KEY, [])
        field_rules = schema.get(CEL_KEY, [])
        if target_rules and field_rules:
            merged[CEL_KEY] = [*target_rules, *field_rules]
        return _structural(merged, defs, embed)

    if "anyOf" in schema:
        options = [o for o in schema["anyOf"] if not _is_null(o)]
        nullable = len(options) < len(schema["anyOf"])
        rest = {k: val for k, val in schema.items() if k != "anyOf"}
        if len(options) == 1:
            out = _structural({**options[0], **rest}, defs, embed)
        elif sorted(o.get("type", "") for o in options) == ["integer", "string"]:
            out = _structural(rest, defs, embed)
            out["x-kubernetes-int-or-string"] = True
            # A string branch's maxLength (it keeps CEL's cost estimate finite) moves up: the
            # branches of int-or-string must stay bare, and maxLength applies to strings only.
            for option in options:
                if "maxLength" in option:
                    out["maxLength"] = option["maxLength"]
        else:
            raise ValueError(f"cannot express anyOf {options} structurally")
        if nullable:
            # Optional fields are omitted, never sent as null (we serialise with exclude_none), so
            # the schema needs no `nullable`; a null default means "no default".
            out.pop("default", None)
        return out

    result: JsonSchema = {}
    for key, value in schema.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "const":
            result["enum"] = [value]
        elif key == "properties":
            result["properties"] = {
                name: _bounded_as_doubles(name, _structural(sub, defs, embed))
                for name, sub in value.items()
            }
        elif key == "items":
            result["items"] = _structural(value, defs, embed)
        elif key == "additionalProperties":
            if isinstance(value, dict):
                result["additionalProperties"] = _structural(value, defs, embed)
            elif value is True:
                result["x-kubernetes-preserve-unknown-fields"] = True
            # `false` beside `properties` is not structural; pruning does that job.
        else:
            result[key] = value
    if "enum" in result and "type" not in result:
        result["type"] = _json_type(result["enum"][0])
    if (
        result.get("type") == "object"
        and "properties" not in result
        and "additionalProperties" not in result
    ):
        result["x-kubernetes-preserve-unknown-fields"] = True
    return result


def _bounded_as_doubles(name: str, node: JsonSchema) -> JsonSchema:
    """A number field with a fractional bound gets the bound again as a CEL rule.

    The API server checks an integer value against `minimum`/`maximum` truncated towards zero
    (kube-openapi's `MinimumNativeType`: `int64(minimum)`), so `0` passes `minimum: 0.001` while
    `0.0` fails it, and pydantic (`pdmtp validate`) refuses both. Truncation errs only for an
    inclusive minimum above zero and an inclusive maximum below zero (elsewhere it rounds the
    bound the safe way). CEL sees a number field as a double whatever its JSON form.
    """
    target = (node.get("items") or {}) if node.get("type") == "array" else node
    if target.get("type") != "number":
        return node
    rules = []
    for bound, op, words, sign in (
        ("minimum", ">=", "at least", 1),
        ("maximum", "<=", "at most", -1),
    ):
        limit = target.get(bound)
        exclusive = target.get(f"exclusive{bound.capitalize()}", False)
        if limit is None or exclusive or float(limit).is_integer() or limit * sign <= 0:
            continue
        rules.append({"rule": f"self {op} {limit!r}", "message": f"{name} must be {words} {limit}"})
    if rules:
        target[CEL_KEY] = [*target.get(CEL_KEY, []), *rules]
    return node


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    return "string"


def _list_maps(schema: JsonSchema) -> None:
    """Mark conditions and per-role lists as maps so server-side apply merges by key."""
    status = schema["properties"]["status"]["properties"]
    for name, key in (("conditions", "type"), ("roles", "name"), ("revisions", "revision")):
        status[name]["x-kubernetes-list-type"] = "map"
        status[name]["x-kubernetes-list-map-keys"] = [key]


def _object_schema(model: type[BaseModel], embed: bool = True) -> JsonSchema:
    """The structural schema of a top-level kind: its model, plus what every object has."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    schema = _structural(raw, defs, embed)
    schema["properties"]["metadata"] = {"type": "object"}
    schema["properties"]["apiVersion"] = {"type": "string"}
    schema["properties"]["kind"] = {"type": "string"}
    schema.pop("description", None)
    schema["required"] = ["spec"]
    return schema


def openapi_schema(embed: bool = True) -> JsonSchema:
    """The structural OpenAPI v3 schema of PDDeployment. `embed=False` leaves the core/v1
    fields as named stand-ins (the field reference links Kubernetes' documentation instead)."""
    schema = _object_schema(PDDeployment, embed)
    schema[CEL_KEY] = [METADATA_NAME.cel_entry(subject="self.metadata.name")]
    _list_maps(schema)
    return schema


def _definition(
    names: dict[str, Any],
    subresources: dict[str, Any],
    columns: list[dict[str, Any]],
    schema: JsonSchema,
) -> dict[str, Any]:
    """A namespaced CustomResourceDefinition of pdmtp's group, one served and stored version."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{names['plural']}.{v.GROUP}",
            "labels": {"app.kubernetes.io/part-of": "pdmtp"},
        },
        "spec": {
            "group": v.GROUP,
            "names": {
                "kind": names["kind"],
                "listKind": f"{names['kind']}List",
                **{key: value for key, value in names.items() if key != "kind"},
                "categories": ["pdmtp"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": v.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": subresources,
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def crd(embed: bool = True) -> dict[str, Any]:
    """The CustomResourceDefinition object (`embed`: see openapi_schema)."""
    names = {
        "kind": v.KIND,
        "plural": v.PLURAL,
        "singular": v.SINGULAR,
        "shortNames": [v.SHORT_NAME],
    }
    return _definition(names, {"status": {}}, PRINTER_COLUMNS, openapi_schema(embed))


ROLE_SCALE_COLUMNS: list[dict[str, Any]] = [
    {
        "name": "Desired",
        "type": "integer",
        "jsonPath": ".spec.replicas",
        "description": "The count asked for (HPA, KEDA or kubectl scale).",
    },
    {
        "name": "Current",
        "type": "integer",
        "jsonPath": ".status.replicas",
        "description": "Live pods of the role.",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def role_scale_crd() -> dict[str, Any]:
    """The PDRoleScale CRD: a scale subresource per External-autoscaled role."""
    names = {
        "kind": v.ROLE_SCALE_KIND,
        "plural": v.ROLE_SCALE_PLURAL,
        "singular": v.ROLE_SCALE_KIND.lower(),
    }
    scale = {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    subresources = {"status": {}, "scale": scale}
    return _definition(names, subresources, ROLE_SCALE_COLUMNS, _object_schema(PDRoleScale))


class _NoAliasDumper(yaml.SafeDumper):
    """Spell every repeated subschema out: anchors make a CRD hard to read and review."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def crd_yaml(kind: str = v.KIND) -> str:
    """A CRD as the YAML committed under crds/: PDDeployment's, or PDRoleScale's."""
    if kind == v.ROLE_SCALE_KIND:
        header = (
            "# Generated by `pdmtp crd --kind PDRoleScale` from operator/pdmtp/api/rolescale.py."
        )
        body = role_scale_crd()
    else:
        header = "# Generated by `pdmtp crd` from operator/pdmtp/api/v1alpha1.py."
        body = crd()
    return f"{header} Do not edit.\n" + yaml.dump(
        body, Dumper=_NoAliasDumper, sort_keys=False, width=100
    )

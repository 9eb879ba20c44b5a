"""What the offline commands read: files of PDDeployments, read as kubectl would send them."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pdmtp.api import crd
from pdmtp.api.v1alpha1 import PDDeployment
from pdmtp.cli.base import UnusableInput
from pdmtp.core.validation import field_problems
from pdmtp.tools import yamlread


def load_documents(path: str) -> list[Any]:
    """The objects of a file ('-' is standard input) as kubectl would send them
    (pdmtp.tools.yamlread: the same YAML and JSON reading, a `List`'s items one by one)."""
    try:
        raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as e:
        raise UnusableInput(f"{path}: cannot read: {e.strerror}") from e
    if b"\x00" in raw:
        raise UnusableInput(f"{path}: contains NUL bytes: not a YAML file")
    warnings: list[str] = []
    try:
        docs = yamlread.read_bytes(raw, warnings)
    except yamlread.ReadError as e:
        where = "" if e.line is None else f" at line {e.line}"
        raise UnusableInput(f"{path}: not valid YAML{where}: {e.message}") from e
    for warning in warnings:  # kubectl sends the last value without a word; so do we, with one
        print(f"warning: {path}: {warning}", file=sys.stderr)
    if not docs:
        raise UnusableInput(f"{path}: no YAML document in the file")
    return docs


def parse(doc: Any, source: str) -> PDDeployment:
    """A PDDeployment from one YAML document, or UnusableInput naming every bad field."""
    if not isinstance(doc, dict):
        raise UnusableInput(f"{source}: expected a PDDeployment object, got {_json_type(doc)}")
    not_json = yamlread.json_problems(doc) or _metadata_problems(doc.get("metadata"))
    if not_json:
        raise UnusableInput(f"{source}: {'; '.join(not_json)}")
    if doc.get("kind") != "PDDeployment" or doc.get("apiVersion") != "pdmtp.io/v1alpha1":
        raise UnusableInput(
            f"{source}: expected apiVersion pdmtp.io/v1alpha1 and kind PDDeployment, got "
            f"{doc.get('apiVersion')!r} {doc.get('kind')!r}"
        )
    try:
        return PDDeployment.model_validate(doc)
    except ValidationError as e:
        raise UnusableInput(f"{source}: {'; '.join(field_problems(e))}") from e


@functools.cache
def _schema() -> dict[str, Any]:
    return crd.openapi_schema()


def without_status(doc: dict[str, Any]) -> dict[str, Any]:
    """The document without .status: the API server drops it from a create or an update (the
    status subresource owns it), so whatever a file carries there is neither refused nor kept."""
    return {k: value for k, value in doc.items() if k != "status"}


def as_stored(doc: Any) -> Any:
    """A PDDeployment document as the API server takes it in: .status dropped (`without_status`)
    and nulls of known fields dropped (pdmtp.tools.yamlread.drop_nulls: `replicas: ~` is `replicas`
    left out, defaulted)."""
    return yamlread.drop_nulls(without_status(doc), _schema()) if isinstance(doc, dict) else doc


_META_STRINGS = ("name", "generateName", "namespace", "selfLink", "uid", "resourceVersion")
_META_FIELDS = frozenset(
    (
        *_META_STRINGS,
        *("generation", "deletionGracePeriodSeconds", "creationTimestamp", "deletionTimestamp"),
        *("labels", "annotations", "ownerReferences", "finalizers", "managedFields"),
    )
)


def _metadata_problems(meta: Any) -> list[str]:
    """What the API server's strict decoding of ObjectMeta refuses before any schema: a field
    ObjectMeta does not have, or a value of the wrong JSON type (pdmtp's own model reads only
    the fields it uses and lets the rest through)."""
    if not isinstance(meta, dict):
        return [] if meta is None else [f"metadata: must be an object (got {_json_type(meta)})"]
    out = []
    for key, value in meta.items():
        where = f"metadata.{key}"
        if key not in _META_FIELDS:
            out.append(f"{where}: unknown field")
        elif key in (*_META_STRINGS, "creationTimestamp", "deletionTimestamp"):
            if not isinstance(value, str):
                out.append(f"{where}: must be a string (got {_json_type(value)})")
        elif key in ("generation", "deletionGracePeriodSeconds"):
            if isinstance(value, bool) or not isinstance(value, int):
                out.append(f"{where}: must be an integer (got {_json_type(value)})")
        elif key in ("labels", "annotations"):
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                out.append(f"{where}: must be a map of strings")
        elif key == "finalizers":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                out.append(f"{where}: must be a list of strings")
        elif not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            out.append(f"{where}: must be a list of objects")
    return out


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return type(value).__name__


def load_one(path: str) -> PDDeployment:
    docs = load_documents(path)
    if len(docs) != 1:
        raise UnusableInput(f"{path}: expected one PDDeployment, found {len(docs)} documents")
    return parse(as_stored(docs[0]), path)

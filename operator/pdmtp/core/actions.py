"""What a reconcile asks the shell to do: writes to children and events to post. Plain data.

An `Apply` carries the whole manifest, stamped with the hash of itself
(`pdmtp.io/applied-hash`): the next reconcile compares stamps and writes nothing when they agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pdmtp.api import vocabulary as v
from pdmtp.core.hashing import short_hash
from pdmtp.core.observe import annotations_of

Obj = Mapping[str, Any]
Manifest = dict[str, Any]
MANIFEST_HASH_LENGTH = 16


@dataclass(frozen=True)
class Apply:
    """Create or update a child with server-side apply."""

    manifest: Manifest
    exists: bool

    @property
    def key(self) -> str:
        return key_of(self.manifest)


@dataclass(frozen=True)
class Scale:
    """Set an old revision's Deployment replicas and nothing else (its template is history)."""

    name: str
    replicas: int
    was: int


@dataclass(frozen=True)
class Delete:
    kind: str
    name: str


Action = Apply | Scale | Delete


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def key_of(obj: Obj) -> str:
    """`Kind/name`: how children are indexed."""
    return f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"


def stamped(manifest: Manifest) -> Manifest:
    """The manifest with its own hash as an annotation, for the next reconcile to compare."""
    digest = short_hash(manifest, MANIFEST_HASH_LENGTH)
    meta = manifest["metadata"]
    meta["annotations"] = {**(meta.get("annotations") or {}), v.ANNOTATION_APPLIED_HASH: digest}
    return manifest


def apply_if_changed(manifest: Manifest, existing: Mapping[str, Obj]) -> Apply | None:
    """An Apply unless the child already carries this manifest's stamp."""
    current = existing.get(key_of(manifest))
    stamped(manifest)
    wanted = manifest["metadata"]["annotations"][v.ANNOTATION_APPLIED_HASH]
    if current is not None and annotations_of(current).get(v.ANNOTATION_APPLIED_HASH) == wanted:
        return None
    return Apply(manifest, exists=current is not None)

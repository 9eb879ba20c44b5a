"""What a reconcile asks the shell to do (writes to children, events to post) and what the shell
reports back (the writes the API server refused). Plain data.

An `Apply` is the whole rendered manifest; it exists only when the child is missing or a field the
operator owns differs from it (`core.drift`), so a settled PDDeployment costs no writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pdmtp.core.drift import drifted
from pdmtp.core.objects import Manifest, Obj, resource_version


@dataclass(frozen=True)
class Apply:
    """Create or update a child with server-side apply."""

    manifest: Manifest
    exists: bool
    drift: tuple[str, ...] = ()
    """For an existing child: the owned fields that differ from the manifest."""
    resource_version: str | None = None
    """The observed version the write is conditional on: set when it changes a replica count,
    so a count decided on a stale view is refused (409) rather than applied."""

    @property
    def key(self) -> str:
        return key_of(self.manifest)

    @property
    def kind(self) -> str:
        return str(self.manifest["kind"])

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])


@dataclass(frozen=True)
class Scale:
    """Set an old revision's Deployment replicas and nothing else (its template is history)."""

    name: str
    replicas: int
    was: int
    resource_version: str | None = None
    """The observed version the write is conditional on (see `Apply.resource_version`)."""

    @property
    def key(self) -> str:
        return f"Deployment/{self.name}"

    kind = "Deployment"


@dataclass(frozen=True)
class SetStatus:
    """Write a child's status subresource (a PDRoleScale's replicas and selector)."""

    kind: str
    name: str
    status: Mapping[str, Any]
    old: Mapping[str, Any]
    """The status observed, so fields it has and `status` drops are cleared."""

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.name}/status"


@dataclass(frozen=True)
class Delete:
    kind: str
    name: str
    why: str = ""
    """For a multi-node group's objects: why the group goes (its event says so)."""

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.name}"


@dataclass(frozen=True)
class Annotate:
    """Merge-patch a pod's annotations (None removes one): the marks of `core.rollout.removal`."""

    name: str
    annotations: Mapping[str, str | None]
    leaving: bool
    """The pod is (now) leaving routing."""

    kind = "Pod"

    @property
    def key(self) -> str:
        return f"Pod/{self.name}"


Action = Apply | Scale | Delete | Annotate | SetStatus


@dataclass(frozen=True)
class Rejection:
    """A write the API server refused: which child, the HTTP status and the server's message."""

    key: str
    status: int
    message: str


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def key_of(obj: Obj) -> str:
    """`Kind/name`: how children are indexed."""
    return f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"


def apply_if_drifted(manifest: Manifest, existing: Mapping[str, Obj]) -> Apply | None:
    """An Apply when the child is missing or differs from the manifest in a field it sets."""
    current = existing.get(key_of(manifest))
    if current is None:
        return Apply(manifest, exists=False)
    paths = drifted(manifest, current)
    if not paths:
        return None
    precondition = resource_version(current) if "spec.replicas" in paths else None
    return Apply(manifest, exists=True, drift=tuple(paths), resource_version=precondition)

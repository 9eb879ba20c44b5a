"""Revision history: the spec of every revision a PDDeployment ran, as ControllerRevisions owned
by it (as StatefulSets and DaemonSets keep theirs). `pdmtp rollout undo` restores a spec from
them, and a deleted Deployment of an old revision is re-created from its revision's spec.

A ControllerRevision is immutable, so one is written per distinct spec: `<name>-<revision>-<h>`
(h: a hash of the spec), numbered in the order they appear. Those of revisions with workloads are
kept; of the rest, the newest `spec.revisionHistoryLimit` are kept.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from pdmtp.api import vocabulary as v
from pdmtp.api.v1alpha1 import PDDeployment, PDDeploymentSpec
from pdmtp.api.vocabulary import EngineRole
from pdmtp.core import names
from pdmtp.core.actions import Action, Delete, apply_if_drifted
from pdmtp.core.effective import resolve
from pdmtp.core.hashing import short_hash
from pdmtp.core.objects import Manifest, Obj, labels_of, metadata_of, name_of
from pdmtp.core.revision import hash_of

SPEC_HASH_LENGTH = 6


@dataclass(frozen=True)
class Recorded:
    """One ControllerRevision: its number, compat revision and spec."""

    name: str
    number: int
    revision: str
    spec: Mapping[str, Any]
    created: str = ""
    """creationTimestamp (RFC 3339)."""

    def parsed(self) -> PDDeploymentSpec | None:
        try:
            return PDDeploymentSpec.model_validate(self.spec)
        except ValidationError:
            return None  # written by another version: not usable to render


def recorded(objs: Sequence[Obj], owner: str) -> list[Recorded]:
    """The owner's ControllerRevisions, oldest first."""
    out = []
    for o in objs:
        if o.get("kind") != "ControllerRevision" or labels_of(o).get(v.LABEL_NAME) != owner:
            continue
        spec = (o.get("data") or {}).get("spec")
        if isinstance(spec, Mapping):
            out.append(
                Recorded(
                    name_of(o),
                    int(o.get("revision") or 0),
                    labels_of(o).get(v.LABEL_REVISION, ""),
                    spec,
                    metadata_of(o).get("creationTimestamp", ""),
                )
            )
    return sorted(out, key=lambda r: r.number)


def latest_spec(history: Sequence[Recorded], revision: str) -> PDDeploymentSpec | None:
    """The newest recorded spec of a revision."""
    for r in reversed(history):
        if r.revision == revision and (spec := r.parsed()) is not None:
            return spec
    return None


def with_template(
    history: Sequence[Recorded], revision: str, role: EngineRole, role_hash: str
) -> Recorded | None:
    """The newest recorded spec of a revision whose `role` renders the template `role_hash`
    (what a failed template roll goes back to)."""
    for r in reversed(history):
        spec = r.parsed() if r.revision == revision else None
        if spec is not None and hash_of(resolve(spec), role) == role_hash:
            return r
    return None


def controller_revision(pdd: PDDeployment, revision: str, number: int) -> Manifest:
    spec = pdd.spec.model_dump(by_alias=True, mode="json", exclude_none=True)
    labels = {**names.base_labels(pdd.metadata.name), v.LABEL_REVISION: revision}
    return {
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {
            "name": f"{pdd.metadata.name}-{revision}-{short_hash(spec, SPEC_HASH_LENGTH)}",
            "namespace": pdd.metadata.namespace,
            "labels": labels,
            "ownerReferences": [names.owner_reference(pdd)],
        },
        "data": {"spec": spec},
        "revision": number,
    }


def history_actions(
    pdd: PDDeployment,
    revision: str,
    history: Sequence[Recorded],
    existing: Mapping[str, Obj],
    live_revisions: Collection[str],
    pinned: Collection[str] = (),
) -> list[Action]:
    """Record the current spec (if not yet) and prune what the limit lets go; `pinned` are kept
    (the specs a template roll may go back to)."""
    actions: list[Action] = []
    manifest = controller_revision(pdd, revision, 0)
    mine = next((r for r in history if r.name == manifest["metadata"]["name"]), None)
    manifest["revision"] = mine.number if mine else max((r.number for r in history), default=0) + 1
    if change := apply_if_drifted(manifest, existing):
        actions.append(change)
    keep = {manifest["metadata"]["name"], *pinned}
    for rev in live_revisions:  # the newest record of each revision that still runs
        newest = [r for r in history if r.revision == rev]
        if newest:
            keep.add(newest[-1].name)
    spare = [r for r in history if r.name not in keep]
    excess = len(spare) - pdd.spec.revision_history_limit
    actions += [Delete("ControllerRevision", r.name) for r in spare[: max(excess, 0)]]
    return actions

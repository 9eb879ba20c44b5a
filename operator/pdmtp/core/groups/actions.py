"""The writes that bring one (revision, multi-node role) to the planned number of groups.

Where a Deployment's ReplicaSet would create and delete pods, the operator does it per group:

- a *broken* group (`grouping.Group.broken`) is deleted whole and a new one takes its place,
  under a new id and so a new PodGroup (the gang covers a group's first placement only);
- a group not yet placed gets its missing pods and its PodGroup (they join the one placement);
- below the planned count, new groups are created whole; above it, groups are deleted whole,
  those the removal gate released first (out of every router's list), then as a ReplicaSet
  ranks pods: not ready, then the newest.

Deleting a group deletes its PodGroup and each of its pods (all owned by the PDDeployment).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from pdmtp.api import vocabulary as v
from pdmtp.core.actions import Action, Apply, Delete
from pdmtp.core.groups.grouping import Group
from pdmtp.core.groups.podgroups import next_group_ids
from pdmtp.core.objects import metadata_of, name_of, pod_ready

Render = Callable[[str], list[dict[str, object]]]
"""A group id -> its PodGroup and pods (`groups.group_objects` for the revision's settings)."""


def _delete(group: Group, why: str) -> list[Action]:
    out: list[Action] = [Delete(v.POD_GROUP_KIND, group.pod_group_name, why)]
    out += [Delete("Pod", name_of(p), why) for _, p in sorted(group.members.items())]
    return out


def _removal_order(groups: Sequence[Group], released: Collection[str]) -> list[Group]:
    def rank(g: Group) -> tuple[bool, bool, str, str]:
        ready = g.complete and all(pod_ready(p) for p in g.members.values())
        newest = max(
            (str(metadata_of(p).get("creationTimestamp") or "") for p in g.members.values()),
            default="",
        )
        return (g.leader_name not in released, ready, _inverted(newest), g.group_id)

    return sorted(groups, key=rank)


def _inverted(stamp: str) -> str:
    # Newest first within a sort that is otherwise ascending.
    return "".join(chr(0x10FFFF - ord(c)) for c in stamp)


def group_actions(
    groups: Sequence[Group],
    want: int,
    render: Render | None,
    released: Collection[str] = frozenset(),
) -> list[Action]:
    """The writes for one (revision, role): `groups` are its observed groups, `want` the planned
    count, `render` None when the revision's settings are unknown (no group can be created)."""
    taken = {g.group_id for g in groups}
    live = [g for g in groups if not g.terminating]
    actions: list[Action] = []
    healthy: list[Group] = []
    for g in live:
        why = g.broken()
        if why is not None:
            actions += _delete(g, f"replacing group {g.group_id} whole: {why}")
        else:
            healthy.append(g)
    if len(healthy) > want:
        excess = _removal_order(healthy, released)[: len(healthy) - want]
        for g in excess:
            actions += _delete(g, f"scale-down removes group {g.group_id}")
        healthy = [g for g in healthy if g not in excess]
    if render is None:
        return actions
    for g in healthy:
        # Not yet placed: create what is missing of it (idempotent: only absent objects).
        if g.placed:
            continue
        for manifest in render(g.group_id):
            if _absent(manifest, g):
                actions.append(Apply(manifest, exists=False))
    for gid in next_group_ids(taken, max(want - len(healthy), 0)):
        actions += [Apply(m, exists=False) for m in render(gid)]
    return actions


def _absent(manifest: dict[str, object], group: Group) -> bool:
    meta = manifest.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if manifest.get("kind") == v.POD_GROUP_KIND:
        return group.pod_group is None
    return name not in {name_of(p) for p in [*group.members.values(), *group.leaving]}

"""Multi-node replicas as the core sees them: each group folded into one unit.

The planner, the removal gate, the router's membership, the autoscaler and the status count
replicas. A group (`core.groups`) is one replica, so this module folds its pods into one *unit*:
a pod-shaped dict named after the leader (rank 0) that carries the leader's address and marks,
is Ready only when every member is Ready and Running only when every member runs. Everything
downstream reads units exactly as it reads single-node pods; so no router can list a non-leader,
and no group serves partly.

It also says which groups are *broken* (vLLM's ranks cannot rejoin a running engine, so the
group is replaced whole) and synthesises, per (revision, role), the workload the planner reads
(`spec.replicas` = live groups), the way it reads a Deployment.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pdmtp.api import vocabulary as v
from pdmtp.core import names
from pdmtp.core.objects import (
    Obj,
    annotations_of,
    created_at,
    format_time,
    is_terminating,
    labels_of,
    metadata_of,
    name_of,
    pod_ready,
)


@dataclass
class Group:
    """One group as observed: its PodGroup (if any) and its pods by rank."""

    name: str
    """The PDDeployment's name."""
    revision: str
    role: str
    group_id: str
    pod_group: Obj | None = None
    members: dict[int, Obj] = field(default_factory=dict)
    """Non-terminating pods by rank."""
    leaving: list[Obj] = field(default_factory=list)
    """Terminating pods (they still hold GPUs; a terminating leader still serves its preStop)."""

    @property
    def size(self) -> int:
        """The group's declared size: its PodGroup's gang, else its pods' env; 0 if unknown."""
        if self.pod_group is not None:
            gang = ((self.pod_group.get("spec") or {}).get("schedulingPolicy") or {}).get("gang")
            if gang and gang.get("minCount"):
                return int(gang["minCount"])
        for pod in [*self.members.values(), *self.leaving]:
            for container in (pod.get("spec") or {}).get("containers") or []:
                for env in container.get("env") or []:
                    if env.get("name") == v.ENV_GROUP_SIZE and env.get("value"):
                        return int(env["value"])
        return 0

    @property
    def leader_name(self) -> str:
        return names.group_pod(self.name, self.revision, self.role, self.group_id, 0)  # type: ignore[arg-type]

    @property
    def pod_group_name(self) -> str:
        return names.group(self.name, self.revision, self.role, self.group_id)  # type: ignore[arg-type]

    @property
    def terminating(self) -> bool:
        """On its way out: its PodGroup is being deleted or gone with every pod terminating."""
        if self.pod_group is not None:
            return is_terminating(self.pod_group)
        return not self.members

    @property
    def complete(self) -> bool:
        return self.size > 0 and all(rank in self.members for rank in range(self.size))

    @property
    def placed(self) -> bool:
        """Some member is bound to a node: the gang's one placement has happened."""
        pods = [*self.members.values(), *self.leaving]
        return any((p.get("spec") or {}).get("nodeName") for p in pods)

    def broken(self) -> str | None:
        """Why the group must be replaced whole, or None. A group not yet placed is only
        incomplete: its missing pods may still join the gang's first placement."""
        if self.terminating:
            return None
        for rank, pod in sorted(self.members.items()):
            status = pod.get("status") or {}
            if status.get("phase") in ("Failed", "Succeeded"):
                return f"pod {name_of(pod)} (rank {rank}) {status['phase'].lower()}"
            for c in status.get("containerStatuses") or []:
                if int(c.get("restartCount") or 0) > 0:
                    return f"pod {name_of(pod)} (rank {rank}) restarted"
        if self.placed:
            missing = [r for r in range(self.size) if r not in self.members]
            if missing:
                gone = ", ".join(
                    names.group_pod(self.name, self.revision, self.role, self.group_id, r)  # type: ignore[arg-type]
                    for r in missing
                )
                return f"member {gone} is gone"
        return None

    def _deletion_timestamp(self) -> str:
        marks = [(self.pod_group or {}).get("metadata") or {}]
        marks += [p.get("metadata") or {} for p in self.leaving]
        stamps = sorted(str(m["deletionTimestamp"]) for m in marks if m.get("deletionTimestamp"))
        return stamps[0] if stamps else format_time(0)

    def unit(self) -> dict[str, Any]:
        """The group as one pod-shaped dict (see the module docstring)."""
        leader = self.members.get(0)
        if leader is None:
            leader = next((p for p in self.leaving if _rank(p) == 0), None)
        meta = dict(metadata_of(leader))
        pods = list(self.members.values())
        created = [created_at(p) for p in pods]
        if self.pod_group is not None:
            created.append(created_at(self.pod_group))
        first = min((c for c in created if c is not None), default=None)
        ready = self.complete and not self.broken() and all(pod_ready(p) for p in pods)
        running = self.complete and all(
            (p.get("status") or {}).get("phase") == "Running" for p in pods
        )
        statuses = [s for p in pods for s in (p.get("status") or {}).get("containerStatuses") or []]
        unit_meta: dict[str, Any] = {
            **meta,
            "name": self.leader_name,
            "labels": {
                **names.group_labels(self.name, self.revision, self.role, self.group_id),  # type: ignore[arg-type]
                **labels_of(leader or {}),
            },
            "annotations": dict(annotations_of(leader or {})),
        }
        if first is not None and "creationTimestamp" not in meta:
            unit_meta["creationTimestamp"] = format_time(first)
        if self.terminating:
            unit_meta["deletionTimestamp"] = self._deletion_timestamp()
        status: dict[str, Any] = {
            "phase": "Running" if running else "Pending",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": statuses,
        }
        ip = ((leader or {}).get("status") or {}).get("podIP")
        if ip:
            status["podIP"] = ip
        return {
            "metadata": unit_meta,
            "spec": dict((leader or {}).get("spec") or {}),
            "status": status,
        }


def _rank(pod: Obj) -> int:
    try:
        return int(labels_of(pod).get(v.LABEL_GROUP_RANK, "0"))
    except ValueError:
        return 0


def _key(obj: Obj) -> tuple[str, str, str, str] | None:
    labels = labels_of(obj)
    gid = labels.get(v.LABEL_GROUP)
    if not gid:
        return None
    return (
        labels.get(v.LABEL_NAME, ""),
        labels.get(v.LABEL_REVISION, ""),
        labels.get(v.LABEL_ROLE, ""),
        gid,
    )


def groups_of(pods: Iterable[Obj], pod_groups: Iterable[Obj]) -> list[Group]:
    """Every group some pod or PodGroup belongs to, sorted by (revision, role, id)."""
    found: dict[tuple[str, str, str, str], Group] = {}

    def group(key: tuple[str, str, str, str]) -> Group:
        if key not in found:
            found[key] = Group(*key)
        return found[key]

    for pg in pod_groups:
        if (key := _key(pg)) is not None:
            group(key).pod_group = pg
    for pod in pods:
        if (key := _key(pod)) is None:
            continue
        g = group(key)
        if is_terminating(pod):
            g.leaving.append(pod)
        else:
            g.members.setdefault(_rank(pod), pod)
    return sorted(found.values(), key=lambda g: (g.revision, g.role, _number(g.group_id)))


def _number(group_id: str) -> int:
    try:
        return int(group_id.lstrip("g"))
    except ValueError:
        return -1


def units(pods: Sequence[Obj], pod_groups: Sequence[Obj]) -> list[Obj]:
    """The pods as the core counts replicas: single-node pods as they are, each group as one
    unit (groups with no pod at all are left out: nothing of them can serve or hold a GPU)."""
    singles: list[Obj] = [p for p in pods if _key(p) is None]
    folded: list[Obj] = [g.unit() for g in groups_of(pods, pod_groups) if g.members or g.leaving]
    return [*singles, *folded]


def workloads(groups: Sequence[Group]) -> list[Obj]:
    """Per (revision, multi-node role) with a live group, a Deployment-shaped dict whose
    `spec.replicas` is its live groups: what `core.rollout.states.revision_states` reads."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for g in groups:
        if g.terminating:
            continue
        key = (g.name, g.revision, g.role)
        created = (g.pod_group or next(iter(g.members.values()), {})).get("metadata") or {}
        entry = out.setdefault(
            key,
            {
                "kind": "Deployment",
                "metadata": {
                    "name": names.workload(g.name, g.revision, g.role),  # type: ignore[arg-type]
                    "labels": names.pod_labels(g.name, g.revision, g.role),  # type: ignore[arg-type]
                    "creationTimestamp": created.get("creationTimestamp"),
                },
                "spec": {"replicas": 0},
            },
        )
        entry["spec"]["replicas"] += 1
        stamp = created.get("creationTimestamp")
        if stamp and (
            not entry["metadata"]["creationTimestamp"]
            or stamp < entry["metadata"]["creationTimestamp"]
        ):
            entry["metadata"]["creationTimestamp"] = stamp
    return list(out.values())

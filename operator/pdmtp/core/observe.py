"""Turn the children the shell listed (plain API dicts) into the planner's view of revisions.

Pods are counted from pods, not from Deployment status: terminating pods still hold GPUs (the
surge ceiling counts them) and a Deployment's status lags its pods.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pdmtp.core import vocabulary as v
from pdmtp.core.planner import RevisionState, RoleState

Obj = Mapping[str, Any]


def parse_time(value: str | None) -> float | None:
    """RFC 3339 (as the API server writes it) to epoch seconds."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def format_time(epoch: float) -> str:
    """Epoch seconds to RFC 3339 in UTC, second precision (metav1.Time)."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def labels_of(obj: Obj) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def annotations_of(obj: Obj) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def is_terminating(obj: Obj) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def is_ready(pod: Obj) -> bool:
    """Ready and not on its way out."""
    if is_terminating(pod):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


@dataclass(frozen=True)
class PodIssue:
    """A pod whose status explains a stalled or failing revision."""

    pod: str
    revision: str
    role: str
    message: str
    exit_code: int = 0
    """For a terminated container: its exit code (the launcher refuses with 3)."""


def _issue(pod: Obj, message: str, exit_code: int = 0) -> PodIssue:
    return PodIssue(
        pod=(pod.get("metadata") or {}).get("name", ""),
        revision=labels_of(pod).get(v.LABEL_REVISION, ""),
        role=labels_of(pod).get(v.LABEL_ROLE, ""),
        message=message,
        exit_code=exit_code,
    )


def engine_failures(pods: Iterable[Obj]) -> list[PodIssue]:
    """Engine containers that terminated with a message, now or in their last run."""
    failures = []
    for pod in pods:
        if labels_of(pod).get(v.LABEL_ROLE) not in v.ENGINE_ROLES or is_terminating(pod):
            continue
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            for state in (status.get("state") or {}, status.get("lastState") or {}):
                ended = state.get("terminated")
                if ended and ended.get("message") and ended.get("exitCode", 0) != 0:
                    message = str(ended["message"]).strip()
                    failures.append(_issue(pod, message, int(ended["exitCode"])))
                    break
    return sorted(failures, key=lambda f: (f.revision, f.role, f.pod))


def unschedulable(pods: Iterable[Obj]) -> list[PodIssue]:
    """Pods the scheduler cannot place (no node has the GPUs, say)."""
    out = []
    for pod in pods:
        if is_terminating(pod):
            continue
        for c in (pod.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable":
                out.append(_issue(pod, str(c.get("message", ""))))
    return sorted(out, key=lambda u: u.pod)


def _role_state(deployment: Obj | None, pods: list[Obj]) -> RoleState:
    replicas = int(((deployment or {}).get("spec") or {}).get("replicas") or 0)
    return RoleState(replicas, len(pods), sum(is_ready(p) for p in pods))


def revision_states(deployments: Iterable[Obj], pods: Iterable[Obj]) -> list[RevisionState]:
    """One RevisionState per revision that has a Deployment or a pod, oldest first."""
    by_workload: dict[tuple[str, str], Obj] = {}
    pods_of: dict[tuple[str, str], list[Obj]] = {}
    revisions: set[str] = set()
    for d in deployments:
        key = (labels_of(d).get(v.LABEL_REVISION, ""), labels_of(d).get(v.LABEL_ROLE, ""))
        if key[0] and not is_terminating(d):
            by_workload[key] = d
            revisions.add(key[0])
    for p in pods:
        key = (labels_of(p).get(v.LABEL_REVISION, ""), labels_of(p).get(v.LABEL_ROLE, ""))
        if key[0]:
            pods_of.setdefault(key, []).append(p)
            revisions.add(key[0])
    states = []
    for rev in revisions:
        created = [
            parse_time((by_workload[(rev, r)].get("metadata") or {}).get("creationTimestamp"))
            for r in ("prefill", "decode", "router")
            if (rev, r) in by_workload
        ]
        router = by_workload.get((rev, "router"))
        drain = parse_time(annotations_of(router).get(v.ANNOTATION_DRAIN_UNTIL)) if router else None
        states.append(
            RevisionState(
                revision=rev,
                prefill=_role_state(
                    by_workload.get((rev, "prefill")), pods_of.get((rev, "prefill"), [])
                ),
                decode=_role_state(
                    by_workload.get((rev, "decode")), pods_of.get((rev, "decode"), [])
                ),
                router=_role_state(router, pods_of.get((rev, "router"), [])),
                drain_until=drain,
                created=min((c for c in created if c is not None), default=float("inf")),
            )
        )
    return sorted(states, key=lambda s: (s.created, s.revision))

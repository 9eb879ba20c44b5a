"""What the pods say, in words a status can carry: the failures, crash loops and unschedulable
pods that explain a stall (`PodIssue`), and the facts an unfinished step waits for (`Wait`).

Pods are counted from pods, not from Deployment status: terminating pods still hold GPUs and a
Deployment's status lags its pods."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import get_args

from pdmtp.api import vocabulary as v
from pdmtp.api.status import WaitReason
from pdmtp.core.objects import (
    Obj,
    annotations_of,
    is_leaving,
    is_terminating,
    labels_of,
    metadata_of,
    name_of,
    parse_time,
    pod_ready,
)

RoleKey = tuple[str, str]
"""(revision, role)."""


@dataclass(frozen=True)
class PodIssue:
    """A pod (or a workload's pods) whose status explains a stalled or failing revision."""

    pod: str
    """The pod, or for a workload that cannot create pods, the Deployment."""
    revision: str
    role: str
    message: str
    exit_code: int = 0
    """For a terminated container: its exit code (the launcher refuses with 3)."""


def _issue(pod: Obj, message: str, exit_code: int = 0) -> PodIssue:
    return PodIssue(
        pod=name_of(pod),
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


CRASH_LOOP_RESTARTS = 3
"""Restarts after which an engine container counts as crash-looping (the kubelet backs off)."""


def crash_looping(pods: Iterable[Obj]) -> list[PodIssue]:
    """Engine containers in CrashLoopBackOff or restarted CRASH_LOOP_RESTARTS times."""
    out = []
    for pod in pods:
        if labels_of(pod).get(v.LABEL_ROLE) not in v.ENGINE_ROLES or is_terminating(pod):
            continue
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (status.get("state") or {}).get("waiting") or {}
            restarts = int(status.get("restartCount") or 0)
            if waiting.get("reason") == "CrashLoopBackOff" or restarts >= CRASH_LOOP_RESTARTS:
                ended = (status.get("lastState") or {}).get("terminated") or {}
                detail = ended.get("message") or ended.get("reason") or waiting.get("reason")
                out.append(_issue(pod, f"{restarts} restarts, last: {detail or 'no message'}"))
                break
    return sorted(out, key=lambda c: (c.revision, c.role, c.pod))


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


def rejected_pods(deployments: Iterable[Obj]) -> list[PodIssue]:
    """Deployments whose pods the API server refuses (ReplicaFailure: quota, admission)."""
    out = []
    for d in deployments:
        if is_terminating(d):
            continue
        for c in (d.get("status") or {}).get("conditions") or []:
            if c.get("type") == "ReplicaFailure" and c.get("status") == "True":
                out.append(_issue(d, str(c.get("message", ""))))
    return sorted(out, key=lambda u: u.pod)


WAIT_ORDER: tuple[WaitReason, ...] = get_args(WaitReason)
"""The order facts are named in (after the stuck ones): what to fix first comes first."""

_IMAGE_PULL = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)
_STARTING = frozenset({"ContainerCreating", "PodInitializing"})
WAIT_MESSAGE_LENGTH = 240
"""A fact's message is cut here (a scheduler's message over many nodes runs long)."""


@dataclass(frozen=True)
class Wait:
    """One object an unfinished step waits for, and why: the facts `Progressing` names."""

    object: str
    """`Kind/name`: a Pod, a PodDisruptionBudget, a router Deployment."""
    revision: str
    role: str
    reason: WaitReason
    message: str
    stuck: bool
    """It will not resolve by itself (capacity, an image, a config, a crash loop, a budget over
    a stuck role): a Warning event when it first appears. Otherwise it is on its way (a pod
    starting, a router rolling, a drain running)."""

    @property
    def key(self) -> tuple[str, str]:
        """What makes a fact new: the object and the kind of wait, not the wording."""
        return (self.object, self.reason)


def as_wait(obj: Obj, kind: str, reason: WaitReason, message: str, stuck: bool) -> Wait:
    labels = labels_of(obj)
    text = " ".join(message.split())
    if len(text) > WAIT_MESSAGE_LENGTH:
        text = text[: WAIT_MESSAGE_LENGTH - 3] + "..."
    return Wait(
        f"{kind}/{name_of(obj)}",
        labels.get(v.LABEL_REVISION, ""),
        labels.get(v.LABEL_ROLE, ""),
        reason,
        text,
        stuck,
    )


def _container_wait(pod: Obj) -> Wait | None:
    """The first container (init containers first) that is held up, and why."""
    status = pod.get("status") or {}
    for c in [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]:
        if c.get("ready"):
            continue
        waiting = (c.get("state") or {}).get("waiting") or {}
        why, detail = str(waiting.get("reason") or ""), str(waiting.get("message") or "")
        name = c.get("name", "")
        said = f"container {name}: {why}" + (f": {detail}" if detail else "")
        restarts = int(c.get("restartCount") or 0)
        if why in _IMAGE_PULL:
            return as_wait(pod, "Pod", "ImagePull", said, stuck=True)
        ended = (c.get("lastState") or {}).get("terminated") or {}
        # Restarted and not Ready again: named as a crash loop between restarts too, so the
        # fact does not come and go with each restart (each return would be news).
        if why == "CrashLoopBackOff" or (restarts and ended):
            last = ended.get("message") or ended.get("reason") or "no message"
            text = f"container {name}: {restarts} restart(s), last: {last}"
            return as_wait(pod, "Pod", "CrashLoop", text, stuck=True)
        if why and why not in _STARTING:
            return as_wait(pod, "Pod", "ContainerError", said, stuck=True)
    return None


def ready_since(pod: Obj) -> str | None:
    """When a pod became Ready (its creation where the condition has no time)."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("lastTransitionTime"):
            return str(c["lastTransitionTime"])
    created = metadata_of(pod).get("creationTimestamp")
    return str(created) if created else None


def pod_waits(pods: Iterable[Obj]) -> list[Wait]:
    """Pods of any revision and role (routers too) that are not Ready, and why: the scheduler's
    message, a container held up (image, config, crash loop), or not Ready yet and since when.
    Pods on their way out (terminating, or marked leaving) are not waited for."""
    out = []
    for pod in pods:
        if is_terminating(pod) or is_leaving(pod) or pod_ready(pod):
            continue
        unplaced = next(
            (
                c
                for c in (pod.get("status") or {}).get("conditions") or []
                if c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
            ),
            None,
        )
        if unplaced is not None:
            out.append(as_wait(pod, "Pod", "Unschedulable", str(unplaced.get("message", "")), True))
            continue
        held = _container_wait(pod)
        if held is not None:
            out.append(held)
            continue
        since = ready_since(pod)
        when = f" since {since}" if since else ""
        if (pod.get("status") or {}).get("phase") == "Running":
            out.append(as_wait(pod, "Pod", "NotReady", f"running, not Ready{when}", False))
        else:
            out.append(as_wait(pod, "Pod", "Starting", f"Pending{when}", False))
    return out


def drain_waits(deployments: Iterable[Obj], now: float) -> list[Wait]:
    """Router Deployments whose revision drains (traffic off) until a time still to come, or
    whose router pods have not been seen to stop serving yet (the drain counts from then)."""
    out = []
    for d in deployments:
        if labels_of(d).get(v.LABEL_ROLE) != "router" or is_terminating(d):
            continue
        marks = annotations_of(d)
        until = marks.get(v.ANNOTATION_DRAIN_UNTIL)
        end = parse_time(until)
        if until and v.ANNOTATION_TRAFFIC_STOPPED not in marks:
            text = "routing stopped; the drain counts from when its router pods stop serving"
            out.append(as_wait(d, "Deployment", "Draining", text, False))
        elif until and end is not None and end > now:
            text = f"traffic stopped; the revision's pods drain until {until}"
            out.append(as_wait(d, "Deployment", "Draining", text, False))
    return out


def draining_roles(pods: Iterable[Obj], cordoned: Collection[str]) -> frozenset[RoleKey]:
    """The (revision, role) pairs with a pod on a cordoned node: where a drain is under way."""
    return frozenset(
        (labels_of(p).get(v.LABEL_REVISION, ""), labels_of(p).get(v.LABEL_ROLE, ""))
        for p in pods
        if (p.get("spec") or {}).get("nodeName") in cordoned
    )


def budget_waits(
    budgets: Iterable[Obj], stuck: Iterable[Wait], draining: Collection[RoleKey]
) -> list[Wait]:
    """Disruption budgets that allow no eviction of their Ready pods while a drain is under way
    on their role (`draining`): the drain waits on them. A budget of 0 is the default for a role
    that may surge (the operator moves a cordoned node's pods itself, `core.render.budgets`), so one
    with no pod on a cordoned node holds nothing back. Stuck when a pod of the same revision and
    role is stuck (the replacement a drain waits for cannot come up). The evictions refused are
    not observable (they leave no trace on the budget or the pod), so what is named is the pods
    a drain could not evict."""
    stuck_roles = {(w.revision, w.role) for w in stuck if w.stuck}
    out = []
    for b in budgets:
        if b.get("kind") != v.DISRUPTION_BUDGET_KIND or is_terminating(b):
            continue
        key = (labels_of(b).get(v.LABEL_REVISION, ""), labels_of(b).get(v.LABEL_ROLE, ""))
        if key not in draining:
            continue
        status = b.get("status") or {}
        if "disruptionsAllowed" not in status or int(status["disruptionsAllowed"]) > 0:
            continue
        healthy, wanted = int(status.get("currentHealthy") or 0), status.get("desiredHealthy")
        if healthy <= 0:
            continue  # unhealthy pods may always be evicted (budgets.py): nothing is held
        expected = status.get("expectedPods")
        text = (
            f"allows no eviction: {healthy} healthy"
            + (f" of {expected}" if expected is not None else "")
            + (f", {wanted} needed" if wanted is not None else "")
            + f"; a node drain cannot evict its {healthy} Ready pod(s) until more are Ready"
        )
        out.append(
            as_wait(b, v.DISRUPTION_BUDGET_KIND, "DisruptionBudget", text, key in stuck_roles)
        )
    return out


def replacing_waits(pods: Iterable[Obj], replacing: Mapping[str, str]) -> list[Wait]:
    """Engine pods being replaced (`core.verification.replacements`): why, until they are gone."""
    return [
        Wait(
            f"Pod/{name_of(p)}",
            labels_of(p).get(v.LABEL_REVISION, ""),
            labels_of(p).get(v.LABEL_ROLE, ""),
            "Replacing",
            f"{replacing[name_of(p)]}; its replacement comes first, then it leaves its routers",
            False,
        )
        for p in pods
        if name_of(p) in replacing and not is_terminating(p)
    ]


def ordered(waits: Iterable[Wait]) -> tuple[Wait, ...]:
    """Stuck first, then in WAIT_ORDER, then by object: the same facts always read the same."""
    rank = {r: i for i, r in enumerate(WAIT_ORDER)}
    unique = {w.key: w for w in waits}
    return tuple(sorted(unique.values(), key=lambda w: (not w.stuck, rank[w.reason], w.object)))


def waits(
    pods: Iterable[Obj],
    deployments: Iterable[Obj],
    budgets: Iterable[Obj],
    now: float,
    cordoned: Collection[str] = frozenset(),
) -> tuple[Wait, ...]:
    """Everything an unfinished step may wait for, across all revisions and roles (routers and
    the anchor revision too), ordered: pods not Ready and why, disruption budgets that hold a
    drain off a `cordoned` node, drains still running (the removal gate's holds are
    `removal.listed_waits`)."""
    pods = list(pods)
    held = pod_waits(pods)
    draining = draining_roles(pods, cordoned)
    return ordered(
        [
            *held,
            *budget_waits(budgets, held, draining),
            *drain_waits(deployments, now),
        ]
    )

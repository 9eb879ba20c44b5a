"""The rollout invariants as one pure checker, fed one observation at a time.

The planner's simulator (`simulate`) feeds it every simulated second; the cluster tier's watcher
feeds it every watch event of a real rollout (its snapshots go through `rollout.states`). Invariants
(docs/design.md, "Rollout invariants"):

1. a router lists only its own revision's engines (`foreign_routes`, over rendered routers);
2. a revision takes traffic only with a ready prefill and a ready decode;
3. pods a client can reach per role stay >= the floor (Ready and listed by a Ready router pod of
   a revision whose router Deployment has replicas: `planner.clients_reach`; a multi-node group
   counts once, whole), all pods per role <= target + maxSurge;
4. an old revision's engine pods start terminating only drainSeconds after its traffic stopped;
5. on a superseded roll (A -> B -> C) the most established revision (A) serves longest;
8. an engine pod starts terminating only once no router pod of its revision lists it (scale-down,
   canary share, a roll's shrinking revision: `core.rollout.removal`).

Two documented exceptions are matched here as in the planner: a one-role floor of 0 makes every
floor 0 (`availability_floor`), and a wedged superseded roll may hold one pod beyond maxSurge.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pdmtp.api import vocabulary as v
from pdmtp.api.vocabulary import EngineRole
from pdmtp.core.objects import engine_url, labels_of
from pdmtp.core.render.membership import router_urls
from pdmtp.core.revision_state import RevisionState, establishment
from pdmtp.core.rollout.planner import (
    Policy,
    Target,
    availability_floor,
    clients_reach,
    reachable_ready,
)


@dataclass(frozen=True)
class Terminating:
    """An engine pod that is on its way out."""

    pod: str
    revision: str
    role: EngineRole


@dataclass(frozen=True)
class Moment:
    """One observation of a PDDeployment's revisions, at `now` (seconds)."""

    now: float
    states: Sequence[RevisionState]
    terminating: Sequence[Terminating] = ()
    label: str = ""
    """What was just observed, for the violation's message."""
    listed: Mapping[str, frozenset[str]] | None = None
    """Per revision, the engines its router pods (terminating ones too) list, by the same names
    as `terminating` uses; None where the observer cannot tell (invariant 8 is not checked)."""


@dataclass
class InvariantMonitor:
    """Invariants 2-5 over a sequence of moments. `retarget` at the start of every roll,
    `rescale` when only the replicas change."""

    policy: Policy
    tolerance: float = 0.0
    """Seconds of observation lag forgiven on invariant 4 (a watcher sees a stop late)."""
    target: Target | None = None
    min_available: dict[EngineRole, int] = field(default_factory=dict)
    max_pods: dict[EngineRole, int] = field(default_factory=dict)
    stopped_at: dict[str, float] = field(default_factory=dict)
    ever_served: set[str] = field(default_factory=set)
    seen_terminating: set[str] = field(default_factory=set)
    seen_leaving_routes: set[str] = field(default_factory=set)
    lowest_reach: dict[EngineRole, int] = field(default_factory=dict)
    """Per role, the fewest pods a client could reach at any moment checked (a figure)."""
    anchor: str | None = None
    """The most established serving old revision when the roll started (invariant 5)."""
    superseded: bool = False

    def retarget(self, states: Sequence[RevisionState], target: Target) -> None:
        """A new target: bounds relative to where the cluster is now."""
        self.target = target
        floor = availability_floor(target, self.policy)
        for role in v.ENGINE_ROLES:
            pods = sum(s.role(role).pods for s in states)
            # Pods already leaving were given up under the previous target: the floor starts
            # from what is listed without them.
            self.min_available[role] = min(floor[role], reachable_ready(states, role))
            self.max_pods[role] = max(target.replicas(role) + self.policy.max_surge, pods)
        olds = [s for s in states if s.revision != target.revision and s.serving]
        self.anchor = max(olds, key=establishment).revision if olds else None

    def rescale(self, states: Sequence[RevisionState], target: Target) -> None:
        """The same roll at new replicas: the bounds move to the new target as `retarget` moves
        them, but the roll keeps its anchor (scaling is not a new roll, invariant 5)."""
        assert self.target is not None and target.revision == self.target.revision
        anchor = self.anchor
        self.retarget(states, target)
        self.anchor = anchor

    def check(self, moment: Moment) -> list[str]:
        """Every invariant broken at this moment (empty: all hold)."""
        assert self.target is not None, "retarget() before check()"
        where = f"at t={moment.now:.1f}" + (f" ({moment.label})" if moment.label else "")
        return [
            *self._traffic(moment, where),
            *self._capacity(moment, where),
            *self._drain(moment, where),
            *self._anchor(moment, where),
            *self._leave_first(moment, where),
        ]

    def _leave_first(self, moment: Moment, where: str) -> list[str]:
        if moment.listed is None:
            return []
        out = []
        for t in moment.terminating:
            if t.pod in self.seen_leaving_routes:
                continue
            self.seen_leaving_routes.add(t.pod)
            if t.pod in moment.listed.get(t.revision, frozenset()):
                out.append(
                    f"invariant 8 {where}: {t.role} pod {t.pod} of {t.revision} began "
                    "terminating while a router of its revision still lists it"
                )
        return out

    def _traffic(self, moment: Moment, where: str) -> list[str]:
        out = []
        for s in moment.states:
            if s.serving:
                self.ever_served.add(s.revision)
                self.stopped_at.pop(s.revision, None)
                if s.prefill.ready < 1 or s.decode.ready < 1:
                    out.append(
                        f"invariant 2 {where}: revision {s.revision} serves without a ready "
                        f"prefill and decode ({s.prefill.ready}P/{s.decode.ready}D)"
                    )
            elif s.revision in self.ever_served:
                self.stopped_at.setdefault(s.revision, moment.now)
        return out

    def _capacity(self, moment: Moment, where: str) -> list[str]:
        assert self.target is not None
        olds = [s for s in moment.states if s.revision != self.target.revision]
        if sum(s.routed for s in olds) >= 2:
            self.superseded = True
        elif not olds:
            self.superseded = False
        out = []
        for role in v.ENGINE_ROLES:
            ready = clients_reach(moment.states, role)
            self.lowest_reach[role] = min(ready, self.lowest_reach.get(role, ready))
            pods = sum(s.role(role).pods for s in moment.states)
            if ready < self.min_available[role]:
                out.append(
                    f"invariant 3 {where}: {ready} {role} pods a client can reach, fewer than "
                    f"{self.min_available[role]} ({_per_revision(moment.states, role)})"
                )
            # The planner's documented exception: a wedged superseded roll (two routed old
            # revisions) may get one pod beyond maxSurge until the old revisions are gone.
            ceiling = self.max_pods[role] + (1 if self.superseded else 0)
            if pods > ceiling:
                out.append(f"invariant 3 {where}: {pods} {role} pods, more than {ceiling}")
        return out

    def _drain(self, moment: Moment, where: str) -> list[str]:
        out = []
        for t in moment.terminating:
            if t.pod in self.seen_terminating:
                continue
            self.seen_terminating.add(t.pod)
            stopped = self.stopped_at.get(t.revision)
            if stopped is None:
                continue  # still serving (a scale-down inside it), or never served
            if moment.now < stopped + self.policy.drain_seconds - self.tolerance:
                out.append(
                    f"invariant 4 {where}: {t.role} pod {t.pod} of {t.revision} began "
                    f"terminating {moment.now - stopped:.1f}s after its traffic stopped "
                    f"(drainSeconds {self.policy.drain_seconds})"
                )
        return out

    def _anchor(self, moment: Moment, where: str) -> list[str]:
        if self.anchor is None or self.target is None:
            return []
        by_rev = {s.revision: s for s in moment.states}
        anchor = by_rev.get(self.anchor)
        if anchor is not None and anchor.serving:
            return []
        others = [
            s.revision
            for s in moment.states
            if s.serving and s.revision not in (self.anchor, self.target.revision)
        ]
        lost = self.anchor
        self.anchor = None
        if others:
            return [
                f"invariant 5 {where}: the most established revision {lost} lost traffic "
                f"while {', '.join(others)} still serve"
            ]
        return []


def _per_revision(states: Iterable[RevisionState], role: EngineRole) -> str:
    """Each revision's [pods, Ready, listed by a Ready router pod, router replicas, Ready router
    pods], for a floor violation: the router's replicas as its Deployment has them (a parked
    router's are 0)."""
    counts = ", ".join(
        f"{s.revision} [{s.role(role).pods}, {s.role(role).ready}, {s.role(role).reached}, "
        f"{0 if s.router_parked else s.router.replicas}, {s.router.ready}]"
        for s in states
    )
    return f"per revision [{role} pods, Ready, listed, router replicas, Ready routers]: {counts}"


def foreign_routes(
    deployments: Iterable[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]]
) -> list[str]:
    """Invariant 1 over live objects: router Deployments whose args name another revision's pod."""
    out = []
    for d in deployments:
        if labels_of(d).get(v.LABEL_ROLE) != "router":
            continue
        rev = labels_of(d).get(v.LABEL_REVISION)
        containers = (((d.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
            "containers"
        ) or [{}]
        urls = router_urls(containers[0].get("args") or [])
        foreign = {
            engine_url(ip)
            for p in pods
            if labels_of(p).get(v.LABEL_REVISION) != rev
            and (ip := (p.get("status") or {}).get("podIP"))
        }
        own = {
            engine_url(ip)
            for p in pods
            if labels_of(p).get(v.LABEL_REVISION) == rev
            and (ip := (p.get("status") or {}).get("podIP"))
        }
        if crossed := (urls & foreign) - own:
            out.append(f"invariant 1: router of {rev} lists {sorted(crossed)}")
    return out

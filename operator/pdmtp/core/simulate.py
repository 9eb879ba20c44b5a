"""A simulated cluster for the rollout planner, and a monitor that checks the invariants.

The simulation plays the parts Kubernetes plays for real: a Deployment controller that creates and
deletes pods (unready ones first, as the ReplicaSet controller does), pods that become ready in an
order the caller's random source decides, terminating pods that linger. `pdmtp plan` prints its
trace; the unit tests drive it with hypothesis over many shapes and policies.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from pdmtp.core.planner import (
    Policy,
    RevisionState,
    RoleState,
    Step,
    Target,
    availability_floor,
    establishment,
    plan,
)
from pdmtp.core.vocabulary import ENGINE_ROLES

ROLES = (*ENGINE_ROLES, "router")


@dataclass
class SimPod:
    ready: bool = False
    terminating_for: int | None = None
    """Ticks left before a terminating pod is gone; None while it runs."""


@dataclass
class SimWorkload:
    replicas: int = 0
    pods: list[SimPod] = field(default_factory=list)

    def active(self) -> list[SimPod]:
        return [p for p in self.pods if p.terminating_for is None]

    def observe(self) -> RoleState:
        return RoleState(self.replicas, len(self.pods), sum(p.ready for p in self.active()))


@dataclass
class SimRevision:
    revision: str
    created: float
    workloads: dict[str, SimWorkload] = field(
        default_factory=lambda: {r: SimWorkload() for r in ROLES}
    )
    drain_until: float | None = None
    deleted: bool = False

    def observe(self) -> RevisionState:
        w = self.workloads
        return RevisionState(
            self.revision,
            w["prefill"].observe(),
            w["decode"].observe(),
            w["router"].observe(),
            None if self.deleted else self.drain_until,
            self.created,
        )


@dataclass
class Termination:
    """An engine pod began terminating."""

    time: float
    revision: str
    role: str


class SimCluster:
    """Deployments and pods of one PDDeployment, advanced in ticks of one second."""

    def __init__(self, terminate_ticks: int = 1) -> None:
        self.now = 0.0
        self.revisions: dict[str, SimRevision] = {}
        self.terminate_ticks = terminate_ticks
        self.terminations: list[Termination] = []

    @classmethod
    def serving(cls, revision: str, target: Target) -> SimCluster:
        """A cluster where `revision` already runs at `target`, all ready and routed."""
        sim = cls()
        rev = SimRevision(revision, created=-1.0)
        counts = {"prefill": target.prefill, "decode": target.decode, "router": target.router}
        for role, n in counts.items():
            rev.workloads[role] = SimWorkload(n, [SimPod(ready=True) for _ in range(n)])
        sim.revisions[revision] = rev
        return sim

    def observe(self) -> list[RevisionState]:
        return [
            r.observe()
            for r in self.revisions.values()
            if not r.deleted or any(w.pods for w in r.workloads.values())
        ]

    def apply(self, step: Step) -> None:
        """Write the planner's step: replicas, drain marks and deletions (pods follow later)."""
        for p in step.revisions:
            rev = self.revisions.get(p.revision)
            if rev is None or rev.deleted:
                if p.delete:
                    continue
                rev = self.revisions[p.revision] = SimRevision(p.revision, created=self.now)
            wanted = {"prefill": p.prefill, "decode": p.decode, "router": p.router}
            for role, workload in rev.workloads.items():
                workload.replicas = 0 if p.delete else wanted[role]
            rev.drain_until = p.drain_until
            rev.deleted = p.delete
        self.run_controllers()

    def run_controllers(self) -> None:
        """The Deployment controller: create missing pods, delete surplus ones unready-first."""
        for rev in self.revisions.values():
            for role, workload in rev.workloads.items():
                active = workload.active()
                for _ in range(workload.replicas - len(active)):
                    workload.pods.append(SimPod())
                surplus = len(active) - workload.replicas
                for pod in sorted(active, key=lambda p: p.ready)[: max(surplus, 0)]:
                    pod.ready = False
                    pod.terminating_for = self.terminate_ticks
                    if role != "router":
                        self.terminations.append(Termination(self.now, rev.revision, role))

    def advance(self, rng: random.Random, ready_chance: float = 0.5) -> None:
        """One second passes: some pods become ready, terminating pods count down."""
        self.now += 1.0
        for rev in self.revisions.values():
            for workload in rev.workloads.values():
                for pod in workload.pods:
                    if pod.terminating_for is not None:
                        pod.terminating_for -= 1
                    elif not pod.ready and rng.random() < ready_chance:
                        pod.ready = True
                workload.pods = [
                    p for p in workload.pods if p.terminating_for is None or p.terminating_for > 0
                ]


class InvariantViolation(AssertionError):
    """The planner broke a rollout invariant; the message says which and when."""


@dataclass
class Monitor:
    """Checks invariants 2-5 at every observed moment of a simulated rollout."""

    target: Target
    policy: Policy
    min_available: dict[str, int] = field(default_factory=dict)
    max_pods: dict[str, int] = field(default_factory=dict)
    served_until: dict[str, float] = field(default_factory=dict)
    ever_served: set[str] = field(default_factory=set)
    anchor: str | None = None
    """The most established old revision when the target was set (invariant 5)."""
    checked_terminations: int = 0
    superseded: bool = False

    def retarget(self, sim: SimCluster, target: Target) -> None:
        """A new target mid-way (or at the start): bounds relative to where the cluster is."""
        self.target = target
        states = sim.observe()
        floor = availability_floor(target, self.policy)
        for role in ENGINE_ROLES:
            ready = sum(s.role(role).ready for s in states if s.serving)
            pods = sum(s.role(role).pods for s in states)
            self.min_available[role] = min(floor[role], ready)
            self.max_pods[role] = max(target.replicas(role) + self.policy.max_surge, pods)
        olds = [s for s in states if s.revision != target.revision and s.serving]
        self.anchor = max(olds, key=establishment).revision if olds else None

    def check(self, sim: SimCluster, moment: str) -> None:
        states = sim.observe()
        olds = [s for s in states if s.revision != self.target.revision]
        if sum(s.routed for s in olds) >= 2:
            self.superseded = True
        elif not olds:
            self.superseded = False
        where = f"at t={sim.now:.0f} ({moment})"
        for s in states:
            if s.serving:
                self.ever_served.add(s.revision)
                self.served_until.pop(s.revision, None)
                if s.prefill.ready < 1 or s.decode.ready < 1:
                    raise InvariantViolation(
                        f"invariant 2 {where}: revision {s.revision} serves without a ready "
                        f"prefill and decode ({s.prefill.ready}P/{s.decode.ready}D)"
                    )
            elif s.revision in self.ever_served and s.revision not in self.served_until:
                self.served_until[s.revision] = sim.now
        for role in ENGINE_ROLES:
            ready = sum(s.role(role).ready for s in states if s.serving)
            pods = sum(s.role(role).pods for s in states)
            if ready < self.min_available[role]:
                raise InvariantViolation(
                    f"invariant 3 {where}: {ready} ready serving {role} pods, "
                    f"fewer than {self.min_available[role]}"
                )
            # The planner's one documented exception: a wedged superseded roll (two routed old
            # revisions) may get one pod beyond maxSurge until the old revisions are gone.
            allowance = 1 if self.superseded else 0
            if pods > self.max_pods[role] + allowance:
                raise InvariantViolation(
                    f"invariant 3 {where}: {pods} {role} pods, more than {self.max_pods[role]}"
                )
        for t in sim.terminations[self.checked_terminations :]:
            stopped = self.served_until.get(t.revision)
            drained_too_soon = stopped is not None and t.time < stopped + self.policy.drain_seconds
            if t.revision in self.ever_served and drained_too_soon:
                raise InvariantViolation(
                    f"invariant 4 {where}: a {t.role} pod of {t.revision} went at "
                    f"t={t.time:.0f}, {t.time - (stopped or 0):.0f}s after its traffic stopped "
                    f"(drainSeconds {self.policy.drain_seconds})"
                )
        self.checked_terminations = len(sim.terminations)
        if self.anchor is not None:
            by_rev = {s.revision: s for s in states}
            anchor = by_rev.get(self.anchor)
            others = [
                s
                for s in states
                if s.serving and s.revision not in (self.anchor, self.target.revision)
            ]
            if (anchor is None or not anchor.serving) and others:
                raise InvariantViolation(
                    f"invariant 5 {where}: the most established revision {self.anchor} lost "
                    f"traffic while {', '.join(s.revision for s in others)} still serve"
                )
            if anchor is None or not anchor.serving:
                self.anchor = None


@dataclass
class Trace:
    """What happened: the planner's steps and the observations they were made from."""

    steps: list[tuple[float, list[RevisionState], Step]] = field(default_factory=list)
    complete: bool = False


def run(
    sim: SimCluster,
    monitor: Monitor,
    target: Target,
    rng: random.Random,
    *,
    max_ticks: int = 2000,
    ready_chance: float = 0.5,
    trace: Trace | None = None,
) -> Trace:
    """Drive the planner until the rollout to `target` completes, checking every moment."""
    trace = trace if trace is not None else Trace()
    monitor.retarget(sim, target)
    monitor.check(sim, "start")
    for _ in range(max_ticks):
        observed = sim.observe()
        step = plan(observed, target, monitor.policy, sim.now)
        trace.steps.append((sim.now, observed, step))
        if step.complete:
            trace.complete = True
            return trace
        sim.apply(step)
        monitor.check(sim, "after the planner's step")
        sim.advance(rng, ready_chance)
        monitor.check(sim, "after pods changed")
    return trace

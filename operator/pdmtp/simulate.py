"""A simulated cluster for the rollout planner, checked by the invariant monitor at every moment.

The simulation plays the parts Kubernetes plays for real: a Deployment controller that creates and
deletes pods (unready ones first, as the ReplicaSet controller does), pods that become ready in an
order the caller's random source decides, terminating pods that linger. `pdmtp plan` prints its
trace; the unit tests drive it with hypothesis over many shapes and policies.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from pdmtp.api.vocabulary import ENGINE_ROLES, ROLES
from pdmtp.core.invariants import InvariantMonitor, Moment, Terminating
from pdmtp.core.planner import Policy, RevisionState, RoleState, Step, Target, plan

_pod_names = itertools.count()


@dataclass
class SimPod:
    ready: bool = False
    terminating_for: int | None = None
    """Ticks left before a terminating pod is gone; None while it runs."""
    name: str = field(default_factory=lambda: f"pod-{next(_pod_names)}")
    scheduled: bool = True
    """Holds a node's capacity; with limited capacity a new pod waits unscheduled, never ready."""


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


class SimCluster:
    """Deployments and pods of one PDDeployment, advanced in ticks of one second.

    `capacity` bounds each engine role's scheduled pods (a full cluster: terminating pods hold
    their GPUs); `failing` revisions never get a ready engine pod (an engine that refuses its
    config or crash-loops).
    """

    def __init__(
        self,
        terminate_ticks: int = 1,
        capacity: dict[str, int] | None = None,
        failing: set[str] | None = None,
    ) -> None:
        self.now = 0.0
        self.revisions: dict[str, SimRevision] = {}
        self.terminate_ticks = terminate_ticks
        self.capacity = capacity or {}
        self.failing = failing or set()

    @classmethod
    def serving(
        cls,
        revision: str,
        target: Target,
        capacity: dict[str, int] | None = None,
        failing: set[str] | None = None,
    ) -> SimCluster:
        """A cluster where `revision` already runs at `target`, all ready and routed."""
        sim = cls(capacity=capacity, failing=failing)
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

    def moment(self, label: str) -> Moment:
        """What a watcher would see now: the revisions and the engine pods on their way out."""
        terminating = [
            Terminating(pod.name, rev.revision, role)
            for rev in self.revisions.values()
            for role in ENGINE_ROLES
            for pod in rev.workloads[role].pods
            if pod.terminating_for is not None
        ]
        return Moment(self.now, self.observe(), terminating, label)

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
            for workload in rev.workloads.values():
                active = workload.active()
                for _ in range(workload.replicas - len(active)):
                    workload.pods.append(SimPod(scheduled=False))
                surplus = len(active) - workload.replicas
                for pod in sorted(active, key=lambda p: p.ready)[: max(surplus, 0)]:
                    pod.ready = False
                    pod.terminating_for = self.terminate_ticks

    def schedule(self) -> None:
        """The scheduler: pending pods take free capacity, oldest revision first."""
        for role in ROLES:
            pods = [p for r in self.revisions.values() for p in r.workloads[role].pods]
            room = self.capacity.get(role, len(pods)) - sum(p.scheduled for p in pods)
            for pod in pods:
                if not pod.scheduled and pod.terminating_for is None and room > 0:
                    pod.scheduled, room = True, room - 1

    def advance(self, rng: random.Random, ready_chance: float = 0.5) -> None:
        """One second passes: some pods become ready, terminating pods count down."""
        self.now += 1.0
        self.schedule()
        for rev in self.revisions.values():
            for role, workload in rev.workloads.items():
                fails = rev.revision in self.failing and role != "router"
                for pod in workload.pods:
                    if pod.terminating_for is not None:
                        pod.terminating_for -= 1
                    elif not pod.ready and pod.scheduled and not fails:
                        pod.ready = rng.random() < ready_chance
                workload.pods = [
                    p for p in workload.pods if p.terminating_for is None or p.terminating_for > 0
                ]


class InvariantViolation(AssertionError):
    """The planner broke a rollout invariant; the message says which and when."""


def check(monitor: InvariantMonitor, sim: SimCluster, label: str) -> None:
    """Feed the monitor one moment of the simulation; raise on the first broken invariant."""
    violations = monitor.check(sim.moment(label))
    if violations:
        raise InvariantViolation(violations[0])


@dataclass
class Trace:
    """What happened: the planner's steps and the observations they were made from."""

    steps: list[tuple[float, list[RevisionState], Step]] = field(default_factory=list)
    complete: bool = False


def run(
    sim: SimCluster,
    monitor: InvariantMonitor,
    target: Target,
    rng: random.Random,
    *,
    policy: Policy | None = None,
    max_ticks: int = 2000,
    ready_chance: float = 0.5,
    trace: Trace | None = None,
    until: Callable[[Step], bool] | None = None,
) -> Trace:
    """Drive the planner until the rollout to `target` completes (or `until` says stop),
    checking every moment. `policy` (default: the monitor's) may pause or hold the rollout; the
    monitor's bounds stay those of its own policy."""
    trace = trace if trace is not None else Trace()
    monitor.retarget(sim.observe(), target)
    check(monitor, sim, "start")
    for _ in range(max_ticks):
        observed = sim.observe()
        step = plan(observed, target, policy or monitor.policy, sim.now)
        trace.steps.append((sim.now, observed, step))
        if step.complete:
            trace.complete = True
            return trace
        if until is not None and until(step):
            return trace
        sim.apply(step)
        check(monitor, sim, "after the planner's step")
        sim.advance(rng, ready_chance)
        check(monitor, sim, "after pods changed")
    return trace

"""A simulated cluster for the rollout planner, checked by the invariant monitor at every moment.

The simulation plays the parts Kubernetes plays for real: a Deployment controller that creates and
deletes pods (unready ones first, then the lowest deletion cost, as the ReplicaSet controller
does), pods that become ready in an order the caller's random source decides, terminating pods
that linger, and routers that list the engines they were started with and are rolled (a new pod
before an old one goes) when that membership changes. The operator's side is the planner and the
removal gate (`core.rollout.removal`), exactly as the reconcile runs them. `pdmtp plan` prints its
trace; the unit tests drive it with hypothesis over many shapes and policies.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pdmtp.api.vocabulary import ENGINE_ROLES, ROLES
from pdmtp.core.revision_state import RevisionState, RoleState, steady_listing
from pdmtp.core.rollout.invariants import InvariantMonitor, Moment, Terminating
from pdmtp.core.rollout.planner import Policy, Step, Target, plan
from pdmtp.core.rollout.removal import EnginePod, Removal, RouterPod, gate, listed_urls

_pod_names = itertools.count()


@dataclass
class SimPod:
    ready: bool = False
    terminating_for: int | None = None
    """Ticks left before a terminating pod is gone; None while it runs."""
    name: str = field(default_factory=lambda: f"pod-{next(_pod_names)}")
    scheduled: bool = True
    """Holds a node's capacity; with limited capacity a new pod waits unscheduled, never ready."""
    created: float = 0.0
    leaving: bool = False
    released: bool = False
    lists: frozenset[str] = frozenset()
    """A router pod's engines (by name), fixed when it starts."""


@dataclass
class SimWorkload:
    replicas: int = 0
    pods: list[SimPod] = field(default_factory=list)
    lists: frozenset[str] = frozenset()
    """A router workload's template: the engines its new pods list."""
    zeroed_at: float | None = None
    """When a router workload was scaled to zero (a slow Deployment controller acts later)."""

    def active(self) -> list[SimPod]:
        return [p for p in self.pods if p.terminating_for is None]

    def observe(
        self, routed: frozenset[str] | None = None, steady: frozenset[str] = frozenset()
    ) -> RoleState:
        """As `core.rollout.states.revision_states` counts it; an engine role's `routed` are the
        engines its revision's Ready router pods list (None for the router role), `steady` those
        its router keeps listed through its own rollout."""
        serving = [p for p in self.active() if p.ready and not p.leaving]
        if routed is None:
            return RoleState(self.replicas, len(self.pods), len(serving))
        return RoleState(
            self.replicas,
            len(self.pods),
            len(serving),
            unlisted=sum(p.name not in routed for p in serving),
            still_listed=sum(p.ready and p.leaving and p.name in routed for p in self.active()),
            dropping=sum(p.name in routed and p.name not in steady for p in serving),
        )

    def steady(self) -> frozenset[str]:
        """A router workload's engines that stay listed through its own rollout."""
        ready = [p.lists for p in self.active() if p.ready]
        return steady_listing(ready, self.lists, self.replicas)

    def routed(self) -> frozenset[str]:
        """A router workload's Ready pods' engines: what its clients reach."""
        return frozenset(name for p in self.active() if p.ready for name in p.lists)


@dataclass
class SimRevision:
    revision: str
    created: float
    workloads: dict[str, SimWorkload] = field(
        default_factory=lambda: {r: SimWorkload() for r in ROLES}
    )
    drain_until: float | None = None
    traffic_stopped: float | None = None
    deleted: bool = False

    def observe(self) -> RevisionState:
        w = self.workloads
        routed, steady = w["router"].routed(), w["router"].steady()
        return RevisionState(
            self.revision,
            w["prefill"].observe(routed, steady),
            w["decode"].observe(routed, steady),
            w["router"].observe(),
            None if self.deleted else self.drain_until,
            None if self.deleted else self.traffic_stopped,
            self.created,
        )


class SimCluster:
    """Deployments and pods of one PDDeployment, advanced in ticks of one second.

    `capacity` bounds each engine role's scheduled pods (a full cluster: terminating pods hold
    their GPUs); `failing` revisions never get a ready engine pod (an engine that refuses its
    config or crash-loops). With `controller_lag` the operator's own write wakes it again before
    the Deployment controller acts on that write (`run` plans twice per tick): it observes the
    new replicas next to the old pods, such as a router Deployment at zero whose pod is still
    Ready. With `router_delay` the Deployment controller removes the pods of a router scaled to
    zero only that many ticks later, on its own time, whether or not the operator looks (after a
    control-plane outage its caches take a while to catch up): the router pod stops serving
    between two of the operator's observations.
    """

    def __init__(
        self,
        terminate_ticks: int = 1,
        capacity: dict[str, int] | None = None,
        failing: set[str] | None = None,
        controller_lag: bool = False,
        router_delay: int = 0,
    ) -> None:
        self.now = 0.0
        self.router_delay = router_delay
        self.revisions: dict[str, SimRevision] = {}
        self.terminate_ticks = terminate_ticks
        self.capacity = capacity or {}
        self.failing = failing or set()
        self.controller_lag = controller_lag

    @classmethod
    def serving(
        cls,
        revision: str,
        target: Target,
        capacity: dict[str, int] | None = None,
        failing: set[str] | None = None,
        controller_lag: bool = False,
        router_delay: int = 0,
    ) -> SimCluster:
        """A cluster where `revision` already runs at `target`, all ready and routed."""
        sim = cls(
            capacity=capacity,
            failing=failing,
            controller_lag=controller_lag,
            router_delay=router_delay,
        )
        rev = SimRevision(revision, created=-1.0)
        counts = {"prefill": target.prefill, "decode": target.decode, "router": target.router}
        for role, n in counts.items():
            rev.workloads[role] = SimWorkload(n, [SimPod(ready=True) for _ in range(n)])
        sim.revisions[revision] = rev
        members = sim.membership(rev, frozenset())
        rev.workloads["router"].lists = members
        for pod in rev.workloads["router"].pods:
            pod.lists = members
        return sim

    def observe(self) -> list[RevisionState]:
        return [
            r.observe()
            for r in self.revisions.values()
            if not r.deleted or any(w.pods for w in r.workloads.values())
        ]

    def moment(self, label: str) -> Moment:
        """What a watcher would see now: the revisions, the engine pods on their way out and the
        engines each revision's router pods list."""
        terminating = [
            Terminating(pod.name, rev.revision, role)
            for rev in self.revisions.values()
            for role in ENGINE_ROLES
            for pod in rev.workloads[role].pods
            if pod.terminating_for is not None
        ]
        return Moment(self.now, self.observe(), terminating, label, listed_urls(self.routers()))

    def engines(self) -> list[EnginePod]:
        """The live engine pods, as the removal gate sees them (a pod's URL is its name)."""
        return [
            EnginePod(
                pod.name,
                rev.revision,
                role,
                pod.name if pod.scheduled else None,
                pod.ready,
                pod.leaving,
                pod.released,
                pod.created,
            )
            for rev in self.revisions.values()
            for role in ENGINE_ROLES
            for pod in rev.workloads[role].active()
        ]

    def routers(self) -> list[RouterPod]:
        """Every router pod, terminating ones too (they serve until they are gone)."""
        return [
            RouterPod(rev.revision, pod.lists)
            for rev in self.revisions.values()
            for pod in rev.workloads["router"].pods
        ]

    @staticmethod
    def membership(rev: SimRevision, leaving: frozenset[str]) -> frozenset[str]:
        """What the operator renders into the revision's router: ready engines, none leaving."""
        return frozenset(
            pod.name
            for role in ENGINE_ROLES
            for pod in rev.workloads[role].active()
            if pod.ready and not pod.leaving and pod.name not in leaving
        )

    def apply(self, step: Step, removal: Removal | None = None, controllers: bool = True) -> None:
        """Write the operator's step: the marks on engine pods, replicas (as the removal gate
        holds them), drain marks, deletions and the routers' membership; then (`controllers`)
        the Deployment controller acts on it (pods follow later)."""
        plans = removal.plans if removal is not None else step.revisions
        if removal is not None:
            for marked in self.revisions.values():
                for engine in ENGINE_ROLES:
                    for pod in marked.workloads[engine].active():
                        pod.leaving = pod.name in removal.leaving
                        pod.released = pod.name in removal.released
        for p in plans:
            rev = self.revisions.get(p.revision)
            if rev is None or rev.deleted:
                if p.delete:
                    continue
                rev = self.revisions[p.revision] = SimRevision(p.revision, created=self.now)
            wanted = {"prefill": p.prefill, "decode": p.decode, "router": p.router}
            for role, workload in rev.workloads.items():
                replicas = 0 if p.delete else wanted[role]
                if replicas == 0 and workload.replicas > 0:
                    workload.zeroed_at = self.now
                workload.replicas = replicas
            rev.drain_until = p.drain_until
            rev.traffic_stopped = p.traffic_stopped
            rev.deleted = p.delete
            rev.workloads["router"].lists = self.membership(rev, frozenset())
        if controllers:
            self.run_controllers()

    def run_controllers(self) -> None:
        """The Deployment controller: create missing pods; delete surplus ones unscheduled
        first, then unready, then the lowest deletion cost, then the newest; roll a router whose
        membership changed (its new pod first, the old one once the new one is ready)."""
        for rev in self.revisions.values():
            for role, workload in rev.workloads.items():
                if role == "router":
                    self._roll_router(workload)
                    continue
                active = workload.active()
                for _ in range(workload.replicas - len(active)):
                    workload.pods.append(SimPod(scheduled=False, created=self.now))
                surplus = len(active) - workload.replicas
                ranked = sorted(
                    active, key=lambda p: (p.scheduled, p.ready, not p.released, -p.created)
                )
                for pod in ranked[: max(surplus, 0)]:
                    self._terminate(pod)

    def _roll_router(self, workload: SimWorkload) -> None:
        """The router Deployment's rolling update (maxSurge 1, maxUnavailable 0): an outdated pod
        goes while the others keep `replicas` ready; new pods come up to one beyond the
        replicas."""
        if workload.replicas == 0:
            since = workload.zeroed_at if workload.zeroed_at is not None else self.now
            if self.now - since >= self.router_delay:
                for pod in workload.active():
                    self._terminate(pod)
            return
        ready = sum(p.ready for p in workload.active())
        for pod in sorted(workload.active(), key=lambda p: p.ready):
            if pod.lists == workload.lists:
                continue
            if not pod.ready or ready - 1 >= workload.replicas:
                ready -= pod.ready
                self._terminate(pod)
        active = workload.active()
        current = [p for p in active if p.lists == workload.lists]
        if len(current) == len(active):
            surplus = max(len(current) - workload.replicas, 0)
            for pod in sorted(current, key=lambda p: p.ready)[:surplus]:
                self._terminate(pod)
        room = min(workload.replicas + 1 - len(active), workload.replicas - len(current))
        for _ in range(max(room, 0)):
            workload.pods.append(SimPod(created=self.now, lists=workload.lists))

    def _terminate(self, pod: SimPod) -> None:
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
        """One second passes: some pods become ready, terminating pods count down, and a slow
        Deployment controller removes the pods of routers scaled to zero long enough ago."""
        self.now += 1.0
        if self.router_delay:
            for rev in self.revisions.values():
                if rev.workloads["router"].replicas == 0:
                    self._roll_router(rev.workloads["router"])
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


def assert_invariants(monitor: InvariantMonitor, sim: SimCluster, label: str) -> None:
    """Feed the monitor one moment of the simulation; raise on the first broken invariant."""
    violations = monitor.check(sim.moment(label))
    if violations:
        raise InvariantViolation(violations[0])


@dataclass
class Trace:
    """What happened: the planner's steps and the observations they were made from."""

    steps: list[tuple[float, list[RevisionState], Step]] = field(default_factory=list)
    complete: bool = False


def simulate_rollout(
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
    rescale: Mapping[int, Target] | None = None,
    outages: Mapping[int, int] | None = None,
) -> Trace:
    """Drive the planner until the rollout to `target` completes (or `until` says stop),
    checking every moment. `policy` (default: the monitor's) may pause or hold the rollout; the
    monitor's bounds stay those of its own policy. `rescale` changes the target at the given
    ticks (replicas moved mid-roll, or a new revision); the monitor's bounds follow it.
    `outages` stop the operator at the given ticks for the given number of ticks (killed, then
    restarted): pods move on without it, and it goes on from what it observes (invariant 6)."""
    trace = trace if trace is not None else Trace()
    monitor.retarget(sim.observe(), target)
    assert_invariants(monitor, sim, "start")
    down = 0
    for tick in range(max_ticks):
        if rescale and tick in rescale:
            target = rescale[tick]
            monitor.retarget(sim.observe(), target)
        down = max(down, (outages or {}).get(tick, 0))
        if down > 0:
            down -= 1
            sim.advance(rng, ready_chance)
            assert_invariants(monitor, sim, "while the operator was down")
            continue
        passes = 2 if sim.controller_lag else 1
        for again in range(passes):
            observed = sim.observe()
            step = plan(observed, target, policy or monitor.policy, sim.now)
            trace.steps.append((sim.now, observed, step))
            if step.complete or (until is not None and until(step)):
                if again:
                    sim.run_controllers()  # what the first pass wrote still takes effect
                trace.complete = step.complete
                return trace
            removal = gate(step.revisions, observed, sim.engines(), sim.routers())
            sim.apply(step, removal, controllers=again == passes - 1)
            assert_invariants(
                monitor,
                sim,
                "after the planner's step" if again == 0 else "after a step that saw its own write",
            )
        sim.advance(rng, ready_chance)
        assert_invariants(monitor, sim, "after pods changed")
    return trace

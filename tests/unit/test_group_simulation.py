"""Multi-node replicas simulated through the real reconcile: rollouts, canaries, scaling and
member failures, checked at every step.

Each example builds a PDDeployment whose prefill, decode or both run multi-node groups (2-4
nodes, DataParallel or TensorParallel), lets `FakeCluster` (in simulation mode: pods become Ready
in an order a random source seeded by hypothesis picks, gangs are placed when it says, deleted
pods linger terminating, routers roll a new pod first, writes are applied as the shell applies
them, stopping at a refusal) bring it up, and then drives the real `decide()` through one of:

- a paired rollout (numSpeculativeTokens or the image changes, so the compat revision does) under
  any maxSurge/maxUnavailable the API accepts, with the replicas changed mid-roll;
- a canary (spec.rollout.canary.percent) held, scaled while held, then promoted (the
  `pdmtp.io/promote` annotation);
- scaling up and down, with no rollout;

with member failures injected at random steps (a member pod deleted, a member's container
restarted, a member set not Ready until it recovers) in half the examples, and the operator killed
for up to 3 steps at up to two random steps of the roll (nothing reconciles while the controllers
and kubelets go on; it continues from what it observes).

Checked at every step, from the raw pods and objects (this file folds groups itself, it does not
use `core.groups.grouping`):

1. no group serves partly: a leader URL a router lists belongs to a group whose every member
   exists, runs, is Ready and never restarted (a single-node pod: exists and is Ready). Router
   Deployments' args (what the operator just wrote) always; router pods (which list what was
   true when they started) except groups a failure was injected into;
2. no router lists a non-leader pod (rank != 0), or a pod under the other role's flag;
3. no router pairs across revisions: every URL a revision's router (Deployment or pod, terminating
   ones too) lists is a pod of that revision;
4. capacity is counted in whole groups: status.roles[].readyReplicas is the number of groups, of
   every revision, whose members are all Ready (and not marked leaving), and replicas the number
   of groups holding any pod, as observed by that reconcile;
5. without injected failures, the rollout invariants (`InvariantMonitor`: the availability floor,
   the surge ceiling, traffic only with a ready prefill and decode, the drain, the anchor, out of
   routing before terminating) over revision states computed from whole groups here: so the
   groups per role that a Ready router pod lists (the floor as clients see it) never drop below
   the floor (with maxUnavailable 0, the desired count, once available).

And at the end, failures stopped and the clock run on past every drain: Available is True, the
spec's revision alone is left (Deployments, PodGroups, Services, pods), with exactly the desired
number of complete Ready groups per role, its rollout is Complete, and one more reconcile writes
nothing. The API server refuses nothing on the way.

Hypothesis does not shrink here (an example is a whole simulation; shrinking one runs for
minutes): a `Violation` says which check broke, when, the spec, the recent history and every pod.
The last tests pin what the simulation found: a router held at zero while its revision has no
ready group of a role (render.router_deployment) was read as "never took traffic", and the
revision retired at once, with no drain, ending a held canary unpromoted.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from builders import compat_revision
from fake_cluster import FakeCluster
from hypothesis import HealthCheck, Phase, event, example, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from pdmtp.api import vocabulary as v
from pdmtp.api.v1alpha1 import PDDeployment
from pdmtp.api.vocabulary import ENGINE_ROLES, EngineRole
from pdmtp.core.actions import Delete
from pdmtp.core.objects import parse_time
from pdmtp.core.revision_state import RevisionState, RoleState
from pdmtp.core.rollout.invariants import InvariantMonitor, Moment, Terminating
from pdmtp.core.rollout.planner import Policy, Target
from pdmtp.core.validation import validate

Obj = dict[str, Any]
NOW = 1_800_000_000.0
NAME = "ds"
LINGER = 2
"""Ticks a deleted pod stays terminating: it outlives the next reconcile."""
UP_STEPS = 80
"""Steps the first rollout (creation) may take."""
ROLL_STEPS = 40
"""Steps with scale changes and failures before the run is left to converge."""
CONVERGE_STEPS = 250
HOLD_STEPS = 200
"""Steps a canary may take to reach its hold."""
FAILURES = ("delete", "restart", "unready")
SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    # No shrinking: an example is a whole simulation, and shrinking one runs for minutes; a
    # Violation's message carries the spec, the recent history and every pod instead.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)


def happened(what: str) -> None:
    """Count it in hypothesis's statistics (`--hypothesis-show-statistics`)."""
    if currently_in_test_context():
        event(what)


class Violation(AssertionError):
    """A check broke; the message says which, when, and what was observed."""


# ---- the spec ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """One role's replica: `nodes` None for one pod, else a group of that many pods."""

    nodes: int | None = None
    layout: str = "DataParallel"
    tensor_parallel: int = 1
    data_parallel: int | None = None
    expert_parallel: bool = False

    @property
    def size(self) -> int:
        return self.nodes or 1

    def role_spec(self, replicas: int) -> Obj:
        spec: Obj = {"replicas": replicas, "tensorParallelSize": self.tensor_parallel}
        if self.nodes is None:
            return spec
        multi: Obj = {"nodes": self.nodes, "layout": self.layout}
        if self.layout == "DataParallel":
            multi["dataParallelSize"] = self.data_parallel
            multi["expertParallel"] = self.expert_parallel
        spec["multiNode"] = multi
        return spec


@st.composite
def group_shapes(draw: st.DrawFn) -> Shape:
    nodes = draw(st.integers(2, 4))
    if draw(st.sampled_from(["DataParallel", "TensorParallel"])) == "DataParallel":
        return Shape(
            nodes,
            "DataParallel",
            tensor_parallel=draw(st.sampled_from([1, 2])),
            data_parallel=nodes * draw(st.integers(1, 2)),
            expert_parallel=draw(st.booleans()),
        )
    return Shape(nodes, "TensorParallel", tensor_parallel=nodes * draw(st.sampled_from([1, 2])))


@st.composite
def role_shapes(draw: st.DrawFn) -> dict[EngineRole, Shape]:
    """Groups in one role or both; the tensor-parallel sizes made to divide one another."""
    grouped = draw(st.sampled_from([("prefill",), ("decode",), ("prefill", "decode")]))
    shapes: dict[EngineRole, Shape] = {
        r: draw(group_shapes()) if r in grouped else Shape() for r in ENGINE_ROLES
    }
    p, d = shapes["prefill"], shapes["decode"]
    tp_p, tp_d = p.tensor_parallel, d.tensor_parallel
    if tp_p % tp_d and tp_d % tp_p:
        # The least common multiple still splits over the decode's nodes (a multiple of tp_d).
        shapes["decode"] = Shape(
            d.nodes,
            d.layout,
            tp_p * tp_d // math.gcd(tp_p, tp_d),
            d.data_parallel,
            d.expert_parallel,
        )
    return shapes


@dataclass(frozen=True)
class Rollout:
    budget: tuple[int, int]
    """(maxSurge, maxUnavailable)."""
    drain_seconds: int

    @property
    def max_surge(self) -> int:
        return self.budget[0]

    @property
    def max_unavailable(self) -> int:
        return self.budget[1]


rollouts = st.builds(
    Rollout,
    # Every combination the API accepts (both 0 is refused: no roll could move).
    st.sampled_from([(s, u) for s in range(3) for u in range(3) if s + u]),
    st.integers(0, 3),
)
replicas = st.integers(1, 3)
_TP3 = Shape(nodes=3, layout="TensorParallel", tensor_parallel=3)


def body(
    shapes: Mapping[EngineRole, Shape],
    counts: Mapping[EngineRole, int],
    rollout: Rollout,
    routers: int,
) -> Obj:
    obj: Obj = {
        "apiVersion": "pdmtp.io/v1alpha1",
        "kind": "PDDeployment",
        "metadata": {"name": NAME, "namespace": "serving", "uid": "u-1", "generation": 1},
        "spec": {
            "model": {"name": "deepseek-ai/DeepSeek-V3", "mtpModules": 1},
            "image": "pdmtp-engine:1",
            "speculative": {"method": "mtp", "numSpeculativeTokens": 1},
            "prefill": shapes["prefill"].role_spec(counts["prefill"]),
            "decode": shapes["decode"].role_spec(counts["decode"]),
            "router": {"replicas": routers},
            # No engine metrics here: the default mode would hold the old revision's last pods
            # for a verdict that never comes (test_verdict_simulation judges rollouts).
            "verification": {"mode": "Report"},
            "rollout": {
                "maxSurge": rollout.max_surge,
                "maxUnavailable": rollout.max_unavailable,
                "drainSeconds": rollout.drain_seconds,
                # No rollback on a slow roll: a roll that never finishes fails convergence.
                "progressDeadlineSeconds": 86400,
            },
        },
    }
    return obj


def accepted(obj: Obj) -> bool:
    """The API (the schema's rules and the agreement) accepts the spec."""
    verdict = validate(obj)
    return verdict.pdd is not None and verdict.agreement is not None


def revision_of(obj: Obj) -> str:
    return compat_revision(PDDeployment.model_validate(obj).spec)


# ---- the cluster as this file sees it ----------------------------------------------------------


def labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def url_of(pod: Mapping[str, Any]) -> str | None:
    ip = (pod.get("status") or {}).get("podIP")
    return f"http://{ip}:{v.ENGINE_HTTP_PORT}" if ip else None


def listed(args: list[str]) -> list[tuple[str, str]]:
    """(flag role, URL) for every engine a router's args list (`--prefill URL PORT`,
    `--decode URL`)."""
    out = []
    for i, arg in enumerate(args):
        if arg == "--prefill":
            assert args[i + 2].isdigit(), f"--prefill {args[i + 1]} has no bootstrap port"
            out.append(("prefill", args[i + 1]))
        elif arg == "--decode":
            out.append(("decode", args[i + 1]))
    return out


@dataclass
class Replica:
    """One replica of an engine role: a group of pods, or one pod."""

    revision: str
    role: EngineRole
    name: str
    """The leader's pod name (a group's, whether or not the leader still exists)."""
    size: int
    members: dict[int, str] = field(default_factory=dict)
    """Live (not terminating) pods by rank."""
    dying: list[str] = field(default_factory=list)
    """Terminating pods."""
    whole_ready: bool = False
    leaving: bool = False

    @property
    def terminating(self) -> bool:
        return not self.members


def replicas_of(fc: FakeCluster, shapes: Mapping[EngineRole, Shape]) -> list[Replica]:
    """Every engine replica that holds a pod: groups folded here, from labels and the shapes."""
    found: dict[tuple[str, str, str], Replica] = {}
    for name, pod in sorted(fc.pods.items()):
        lab = labels(pod)
        role = lab.get(v.LABEL_ROLE)
        if role not in ENGINE_ROLES:
            continue
        revision = lab[v.LABEL_REVISION]
        group = lab.get(v.LABEL_GROUP)
        shape = shapes[role]
        assert (group is not None) == (shape.nodes is not None), f"{name}: grouped {group}"
        if group is None:
            key, leader, rank = (revision, role, name), name, 0
        else:
            key = (revision, role, group)
            leader = f"{NAME}-{revision}-{role}-{group}-0"
            rank = int(lab[v.LABEL_GROUP_RANK])
            assert name == f"{NAME}-{revision}-{role}-{group}-{rank}", name
        replica = found.setdefault(key, Replica(revision, role, leader, shape.size))
        if fc.terminating(name):
            replica.dying.append(name)
        else:
            assert rank not in replica.members, f"two live pods of rank {rank}: {name}"
            replica.members[rank] = name
    for replica in found.values():
        replica.whole_ready = set(replica.members) == set(range(replica.size)) and all(
            pod_ready(fc.pods[n]) for n in replica.members.values()
        )
        leader = fc.pods.get(replica.name)
        notes = (leader or {}).get("metadata", {}).get("annotations") or {}
        replica.leaving = v.ANNOTATION_LEAVING in notes
    return list(found.values())


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Running, Ready, never restarted, not terminating."""
    status = pod.get("status") or {}
    conditions = status.get("conditions") or []
    restarted = any(c.get("restartCount") for c in status.get("containerStatuses") or [])
    return (
        status.get("phase") == "Running"
        and any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        and not restarted
        and not (pod.get("metadata") or {}).get("deletionTimestamp")
    )


# ---- the simulation ----------------------------------------------------------------------------


@dataclass
class Sim:
    """One PDDeployment in a simulating FakeCluster, stepped and checked."""

    fc: FakeCluster
    shapes: Mapping[EngineRole, Shape]
    rng: random.Random
    t: float = NOW
    steps: int = 0
    known: dict[str, Obj] = field(default_factory=dict)
    """Every pod ever seen with an address, by URL (addresses are never reused)."""
    injected: set[str] = field(default_factory=set)
    """Leader URLs of groups a failure was injected into: their routers may lag."""
    failures: int = 0
    monitor: InvariantMonitor | None = None
    log: list[str] = field(default_factory=list)
    kills: dict[int, int] = field(default_factory=dict)
    """Operator kills: at step n (counted from the start), down for that many steps."""
    down: int = 0
    """Steps left with no operator (killed; its restart continues from what it observes)."""
    _revision: str | None = None
    _found: list[Replica] | None = None

    @classmethod
    def start(
        cls, obj: Obj, shapes: Mapping[EngineRole, Shape], rng: random.Random, monitored: bool
    ) -> Sim:
        fc = FakeCluster(copy.deepcopy(obj), rng=rng, linger=LINGER)
        sim = cls(fc, shapes, rng)
        if monitored:
            rollout = obj["spec"]["rollout"]
            policy = Policy(rollout["maxSurge"], rollout["maxUnavailable"], rollout["drainSeconds"])
            sim.monitor = InvariantMonitor(policy)
            sim.monitor.retarget([], sim.target())
        return sim

    # -- the spec -------------------------------------------------------------------------------

    @property
    def spec(self) -> Obj:
        spec: Obj = self.fc.body["spec"]
        return spec

    @property
    def revision(self) -> str:
        if self._revision is None:
            self._revision = revision_of(self.fc.body)
        return self._revision

    def found(self) -> list[Replica]:
        """The replicas now (cached until the cluster next changes: `changed`)."""
        if self._found is None:
            self._found = replicas_of(self.fc, self.shapes)
        return self._found

    def changed(self) -> None:
        self._found = None

    def target(self) -> Target:
        return Target(
            self.revision,
            self.spec["prefill"]["replicas"],
            self.spec["decode"]["replicas"],
            self.spec["router"]["replicas"],
        )

    def edit(self, what: str, change: Any) -> None:
        """Change the spec (a new generation); the monitor's bounds follow a new target."""
        change(self.spec)
        self._revision = None
        meta = self.fc.body["metadata"]
        meta["generation"] += 1
        assert accepted(self.fc.body), f"the edit {what} made a spec the API refuses"
        self.log.append(f"t={self.t - NOW:.0f}: {what}")
        if self.monitor is not None:
            states = self.states()
            if self.monitor.target is not None and self.monitor.target.revision == self.revision:
                self.monitor.rescale(states, self.target())
            else:
                self.monitor.retarget(states, self.target())

    def scale(self, role: EngineRole, count: int) -> None:
        self.edit(f"{role} replicas -> {count}", lambda s: s[role].update(replicas=count))

    def promote(self) -> None:
        notes = self.fc.body["metadata"].setdefault("annotations", {})
        notes[v.ANNOTATION_PROMOTE] = self.revision
        self.log.append(f"t={self.t - NOW:.0f}: promoted {self.revision}")

    @property
    def status(self) -> Obj:
        status: Obj = self.fc.body.get("status") or {}
        return status

    def condition(self, kind: str) -> str | None:
        return next(
            (c["status"] for c in self.status.get("conditions") or [] if c["type"] == kind), None
        )

    @property
    def phase(self) -> str | None:
        return (self.status.get("rollout") or {}).get("phase")

    # -- one step -------------------------------------------------------------------------------

    def kill(self, plan: Iterable[tuple[int, int]]) -> None:
        """Kill the operator at these steps from now, each for that many steps."""
        for at, steps in plan:
            self.kills[self.steps + at] = max(steps, self.kills.get(self.steps + at, 0))

    def step(self, dt: float = 1.0) -> None:
        """One reconcile (none while the operator is down), then the controllers, the scheduler
        and the kubelets; checked after each."""
        self.down = max(self.down, self.kills.pop(self.steps, 0))
        if self.down > 0:
            self.down -= 1
            self.steps += 1
            self.log.append(f"t={self.t - NOW:.0f}: the operator is down")
            happened("the operator killed mid-run")
        else:
            self._reconcile()
        self.fc.run_pods()
        self.fc.place_groups()
        self.fc.tick()
        self.changed()
        self.learn()
        self.check_routers(deployments=False)
        self.check_monitor("after the pods changed")
        self.t += dt

    def _reconcile(self) -> None:
        expected = self.counts()
        phase = self.phase
        decision = self.fc.reconcile(self.t)
        self.changed()
        self.steps += 1
        if self.phase != phase:
            self.log.append(f"t={self.t - NOW:.0f}: rollout {phase} -> {self.phase}")
            happened(f"rollout phase {self.phase}")
        for action in decision.actions:
            if isinstance(action, Delete) and action.kind == v.POD_GROUP_KIND:
                happened("a group deleted: " + action.why.split(" group ")[0].split(":")[0])
        if self.fc.refusals:
            self.fail(f"the API server refused {self.fc.refusals[0]}")
        self.check_status(expected)
        self.check_routers(deployments=True)
        self.check_monitor("after the reconcile")

    def learn(self) -> None:
        for pod in self.fc.pods.values():
            url = url_of(pod)
            if url is not None and url not in self.known:
                self.known[url] = copy.deepcopy(pod["metadata"])

    def fail(self, message: str) -> None:
        history = "\n  ".join(self.log[-20:])
        raise Violation(
            f"at t={self.t - NOW:.0f} (step {self.steps}): {message}\n"
            f"  spec: prefill {self.shapes['prefill']} x{self.spec['prefill']['replicas']}, "
            f"decode {self.shapes['decode']} x{self.spec['decode']['replicas']}, "
            f"rollout {self.spec['rollout']}\n  recent: {history}\n"
            f"  pods: {self.describe()}"
        )

    def describe(self) -> str:
        out = []
        for name, pod in sorted(self.fc.pods.items()):
            ready = "R" if pod_ready(pod) else "-"
            term = "T" if self.fc.terminating(name) else ""
            note = "L" if v.ANNOTATION_LEAVING in (pod["metadata"].get("annotations") or {}) else ""
            out.append(f"{name}[{ready}{term}{note} {url_of(pod) or 'no ip'}]")
        return ", ".join(out)

    # -- failures -------------------------------------------------------------------------------

    def inject(self, kind: str) -> None:
        """A member of some group fails: its pod deleted, its container restarted, or it
        turns not Ready (it recovers as pods become Ready)."""
        candidates = [
            name
            for name, pod in sorted(self.fc.pods.items())
            if v.LABEL_GROUP in labels(pod)
            and not self.fc.terminating(name)
            and (kind == "delete" or pod["status"].get("phase") == "Running")
        ]
        if not candidates:
            return
        name = self.rng.choice(candidates)
        pod = self.fc.pods[name]
        lab = labels(pod)
        leader = self.fc.pods.get(
            f"{NAME}-{lab[v.LABEL_REVISION]}-{lab[v.LABEL_ROLE]}-{lab[v.LABEL_GROUP]}-0"
        )
        if leader is not None and (url := url_of(leader)) is not None:
            self.injected.add(url)
        self.failures += 1
        happened(f"failure injected: {kind}")
        if leader is not None and url_of(leader) in self.listed_urls():
            happened("failure injected into a routed group")
        self.log.append(f"t={self.t - NOW:.0f}: {kind} {name}")
        if kind == "delete":
            self.fc.delete_pod(name)
        elif kind == "restart":
            pod["status"]["containerStatuses"] = [{"name": "engine", "restartCount": 1}]
        else:
            pod["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
        self.changed()
        self.check_routers(deployments=False)

    # -- the checks -----------------------------------------------------------------------------

    def listed_urls(self) -> set[str]:
        return {
            url
            for p in self.fc.pods.values()
            if labels(p).get(v.LABEL_ROLE) == "router"
            for _, url in listed(args_of(p))
        }

    def counts(self) -> dict[EngineRole, tuple[int, int]]:
        """Per role: (groups holding any pod, groups whose members are all Ready and that are
        not marked leaving), over every revision."""
        out: dict[EngineRole, tuple[int, int]] = {}
        found = self.found()
        for role in ENGINE_ROLES:
            mine = [r for r in found if r.role == role]
            out[role] = (len(mine), sum(r.whole_ready and not r.leaving for r in mine))
        return out

    def check_status(self, expected: Mapping[EngineRole, tuple[int, int]]) -> None:
        """4: the status counts whole groups, as the reconcile observed them."""
        roles = {r["name"]: r for r in self.status.get("roles") or []}
        for role in ENGINE_ROLES:
            entry = roles.get(role)
            if entry is None:
                self.fail(f"status.roles has no {role}")
            assert entry is not None
            pods, ready = expected[role]
            got = (entry.get("replicas", 0), entry.get("readyReplicas", 0))
            if got != (pods, ready):
                self.fail(
                    f"status.roles[{role}] says replicas {got[0]}, readyReplicas {got[1]}; "
                    f"observed {pods} groups holding pods, {ready} whole Ready"
                )
            desired = self.spec[role]["replicas"]
            if self.status.get(role) != f"{ready}/{desired}":
                self.fail(f"status.{role} is {self.status.get(role)}, not {ready}/{desired}")

    def check_routers(self, *, deployments: bool) -> None:
        """1-3 over what the routers list: the Deployments' args (what the operator just wrote)
        or the router pods' (terminating ones too; a pod keeps the args it started with)."""
        found = self.found()
        whole = {r.name for r in found if r.whole_ready}
        if deployments:
            sources = [
                (f"Deployment/{name_of(o)}", labels(o)[v.LABEL_REVISION], args_of(o["spec"]))
                for key, o in sorted(self.fc.objects.items())
                if key.startswith("Deployment/") and labels(o).get(v.LABEL_ROLE) == "router"
            ]
        else:
            sources = [
                (f"router pod {name}", labels(p)[v.LABEL_REVISION], args_of(p))
                for name, p in sorted(self.fc.pods.items())
                if labels(p).get(v.LABEL_ROLE) == "router"
            ]
        for source, revision, args in sources:
            for role, url in listed(args):
                meta = self.known.get(url)
                if meta is None:
                    self.fail(f"{source} lists {url}, no pod's address")
                assert meta is not None
                lab, name = meta["labels"], meta["name"]
                if lab.get(v.LABEL_REVISION) != revision:
                    self.fail(
                        f"3: {source} of revision {revision} lists {name} of "
                        f"{lab.get(v.LABEL_REVISION)}"
                    )
                if lab.get(v.LABEL_ROLE) != role:
                    self.fail(f"2: {source} lists {lab.get(v.LABEL_ROLE)} {name} as a {role}")
                if lab.get(v.LABEL_GROUP_RANK, "0") != "0":
                    self.fail(f"2: {source} lists {name}, rank {lab[v.LABEL_GROUP_RANK]}")
                if name not in whole and (deployments or url not in self.injected):
                    self.fail(
                        f"1: {source} lists {name} ({url}), whose group is not whole and Ready"
                    )

    def states(self) -> list[RevisionState]:
        """Every revision as the monitor reads it, in whole groups (computed here)."""
        found = self.found()
        deployments = {
            (labels(o)[v.LABEL_REVISION], labels(o)[v.LABEL_ROLE]): o
            for k, o in self.fc.objects.items()
            if k.startswith("Deployment/")
        }
        created: dict[str, list[str]] = {}
        for k, o in self.fc.objects.items():
            rev = labels(o).get(v.LABEL_REVISION)
            if rev and (k.startswith("Deployment/") or k.startswith(f"{v.POD_GROUP_KIND}/")):
                created.setdefault(rev, []).append(o["metadata"]["creationTimestamp"])
        revisions = {r.revision for r in found} | {rev for rev, _ in deployments}
        revisions |= {
            labels(p)[v.LABEL_REVISION]
            for p in self.fc.pods.values()
            if v.LABEL_REVISION in labels(p)
        }
        states = []
        for rev in sorted(revisions):
            # What clients reach: the leaders that the revision's Ready router pods list.
            routed = {
                url
                for p in self.fc.pods.values()
                if labels(p).get(v.LABEL_ROLE) == "router"
                and labels(p)[v.LABEL_REVISION] == rev
                and pod_ready(p)
                for _, url in listed(args_of(p))
            }
            roles: dict[str, RoleState] = {}
            for role in ENGINE_ROLES:
                mine = [r for r in found if r.revision == rev and r.role == role]
                dep = deployments.get((rev, role))
                live = (
                    sum(not r.terminating for r in mine)
                    if self.shapes[role].nodes is not None
                    else int(dep["spec"]["replicas"])
                    if dep
                    else 0
                )
                whole = [r for r in mine if r.whole_ready]
                in_routing = [r for r in whole if url_of(self.fc.pods[r.name]) in routed]
                roles[role] = RoleState(
                    live,
                    len(mine),
                    sum(not r.leaving for r in whole),
                    unlisted=sum(not r.leaving for r in whole)
                    - sum(not r.leaving for r in in_routing),
                    still_listed=sum(r.leaving for r in in_routing),
                )
            router = deployments.get((rev, "router"))
            pods = [
                n
                for n, p in self.fc.pods.items()
                if labels(p).get(v.LABEL_ROLE) == "router" and labels(p)[v.LABEL_REVISION] == rev
            ]
            roles["router"] = RoleState(
                int(router["spec"]["replicas"]) if router else 0,
                len(pods),
                sum(pod_ready(self.fc.pods[n]) for n in pods),
            )
            notes = (router or {}).get("metadata", {}).get("annotations") or {}
            drain = notes.get(v.ANNOTATION_DRAIN_UNTIL)
            stamps = sorted(created.get(rev, []))
            states.append(
                RevisionState(
                    rev,
                    roles["prefill"],
                    roles["decode"],
                    roles["router"],
                    parse(drain) if drain else None,
                    parse(stamps[0]) if stamps else float("inf"),
                )
            )
        return sorted(states, key=lambda s: (s.created, s.revision))

    def check_monitor(self, label: str) -> None:
        """5: the rollout invariants over whole groups, while no failure was injected."""
        if self.monitor is None or self.failures:
            return
        found = self.found()
        terminating = [Terminating(r.name, r.revision, r.role) for r in found if r.terminating]
        by_url = {
            url_of(self.fc.pods[n]): r for r in found for n in [*r.members.values(), *r.dying]
        }
        lists: dict[str, set[str]] = {}
        for pod in self.fc.pods.values():
            if labels(pod).get(v.LABEL_ROLE) != "router":
                continue
            for _, url in listed(args_of(pod)):
                if (r := by_url.get(url)) is not None:
                    lists.setdefault(labels(pod)[v.LABEL_REVISION], set()).add(r.name)
        moment = Moment(
            self.t,
            self.states(),
            terminating,
            label,
            {rev: frozenset(names) for rev, names in lists.items()},
        )
        if violations := self.monitor.check(moment):
            self.fail(violations[0])

    # -- phases ---------------------------------------------------------------------------------

    def play(
        self, scales: Iterable[tuple[int, EngineRole, int]], failures: Iterable[tuple[int, str]]
    ) -> None:
        """Step on, scaling and injecting failures at their steps, up to the last of them."""
        scales, failures = list(scales), list(failures)
        last = max([at for at, _, _ in scales] + [at for at, _ in failures], default=-1)
        for i in range(last + 1):
            for at, role, count in scales:
                if at == i:
                    self.scale(role, count)
            for at, kind in failures:
                if at == i:
                    self.inject(kind)
            self.step()

    def run(self, steps: int, failures: Mapping[int, list[str]] | None = None) -> None:
        for i in range(steps):
            for kind in (failures or {}).get(i, []):
                self.inject(kind)
            self.step()

    def run_until(self, done: Any, steps: int, what: str) -> None:
        for _ in range(steps):
            if done():
                return
            self.step()
        if not done():
            self.fail(f"{what} not reached in {steps} steps (phase {self.phase})")

    def converged(self) -> str | None:
        """Why the deployment has not converged yet (None: it has)."""
        rev = self.revision
        if self.condition("Available") != "True":
            return "not Available"
        if self.phase != "Complete":
            return f"rollout phase {self.phase}"
        stray = [
            k
            for k, o in self.fc.objects.items()
            if labels(o).get(v.LABEL_REVISION, rev) != rev and o["kind"] != "ControllerRevision"
        ]
        stray += [n for n, p in self.fc.pods.items() if labels(p).get(v.LABEL_REVISION) != rev]
        if stray:
            return f"objects of old revisions left: {sorted(stray)}"
        found = self.found()
        for role in ENGINE_ROLES:
            mine = [r for r in found if r.role == role]
            want = self.spec[role]["replicas"]
            whole = [r for r in mine if r.whole_ready and not r.dying and not r.leaving]
            if len(whole) != want or len(mine) != want:
                return f"{role}: {len(whole)} whole Ready groups of {len(mine)}, want {want}"
            groups = [k for k in self.fc.objects if k.startswith(f"{v.POD_GROUP_KIND}/")]
            if (
                self.shapes[role].nodes is not None
                and len([k for k in groups if f"-{role}-g" in k]) != want
            ):
                return f"{role}: PodGroups {sorted(groups)}"
        routers = [p for p in self.fc.pods.values() if labels(p).get(v.LABEL_ROLE) == "router"]
        if sum(pod_ready(p) for p in routers) != self.spec["router"]["replicas"] or any(
            not pod_ready(p) for p in routers
        ):
            return "routers still rolling"
        return None

    def converge(self) -> None:
        """Failures have stopped; time runs on (past every drain) until it settles."""
        for _ in range(CONVERGE_STEPS):
            if self.converged() is None:
                break
            self.step(dt=2.0)
        if (why := self.converged()) is not None:
            self.fail(f"did not converge in {CONVERGE_STEPS} steps: {why}")
        decision = self.fc.reconcile(self.t)
        if decision.actions:
            self.fail(f"settled, yet the reconcile writes {[a.key for a in decision.actions]}")


def name_of(obj: Mapping[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def args_of(pod_or_spec: Mapping[str, Any]) -> list[str]:
    spec = pod_or_spec.get("template", {}).get("spec") or pod_or_spec["spec"]
    return list(spec["containers"][0].get("args") or [])


def parse(stamp: str) -> float:
    value = parse_time(stamp)
    assert value is not None
    return value


# ---- the scenarios -----------------------------------------------------------------------------

failure_plans = st.lists(
    st.tuples(st.integers(0, ROLL_STEPS - 1), st.sampled_from(FAILURES)), min_size=1, max_size=4
)
failure_sets = st.booleans().flatmap(lambda on: failure_plans if on else st.just([]))
"""Half the examples inject failures (the rest are checked by the rollout invariants too)."""
kill_plans = st.lists(st.tuples(st.integers(0, ROLL_STEPS - 1), st.integers(1, 3)), max_size=2)
"""Operator kills during the roll: (step, steps down)."""
scale_plans = st.lists(
    st.tuples(st.integers(0, ROLL_STEPS - 1), st.sampled_from(ENGINE_ROLES), replicas),
    max_size=3,
)


def by_step(plan: Iterable[tuple[int, str]]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for at, kind in plan:
        out.setdefault(at, []).append(kind)
    return out


def up(
    shapes: dict[EngineRole, Shape],
    counts: dict[EngineRole, int],
    rollout: Rollout,
    routers: int,
    rng: random.Random,
    monitored: bool,
) -> Sim:
    """A new PDDeployment brought up (itself checked at every step) and settled."""
    obj = body(shapes, counts, rollout, routers)
    assert accepted(obj), f"the strategies made a spec the API refuses: {obj['spec']}"
    sim = Sim.start(obj, shapes, rng, monitored)
    sim.run_until(lambda: sim.converged() is None, UP_STEPS, "the first rollout's completion")
    grouped = [r for r in ENGINE_ROLES if shapes[r].nodes is not None]
    happened(f"groups in {' and '.join(grouped)}")
    for r in grouped:
        happened(f"{r}: {shapes[r].nodes} nodes, {shapes[r].layout}")
    if sim.monitor is not None:
        # Available now: the floor holds from here on (the creation's was 0).
        sim.monitor.retarget(sim.states(), sim.target())
    return sim


def roll_and_scale(
    sim: Sim,
    change: str,
    scales: list[tuple[int, EngineRole, int]],
    failures: list[tuple[int, str]],
) -> None:
    """A paired rollout (the compat revision changes), scaled and failing as planned."""
    if change == "speculative":
        sim.edit(
            "numSpeculativeTokens 1 -> 2", lambda s: s["speculative"].update(numSpeculativeTokens=2)
        )
    else:
        sim.edit("image -> pdmtp-engine:2", lambda s: s.update(image="pdmtp-engine:2"))
    sim.play(scales, failures)


@SETTINGS
@given(
    shapes=role_shapes(),
    prefill=replicas,
    decode=replicas,
    rollout=rollouts,
    routers=st.integers(1, 2),
    change=st.sampled_from(["speculative", "image"]),
    scales=scale_plans,
    failures=failure_sets,
    kills=kill_plans,
    seed=st.integers(0, 2**32 - 1),
)
# A group's leader deleted while the operator was down: back, it marked the gone leader (the
# group's marks live there) beside replacing the group whole, and the write met a 404.
@example(
    shapes={"prefill": _TP3, "decode": _TP3},
    prefill=3,
    decode=2,
    rollout=Rollout((2, 0), 3),
    routers=2,
    change="image",
    scales=[(11, "prefill", 2)],
    failures=[(16, "delete"), (2, "delete"), (2, "unready")],
    kills=[(2, 2)],
    seed=3395660,
)
def test_a_paired_rollout_of_groups_scaled_and_failing_keeps_every_check(
    shapes: dict[EngineRole, Shape],
    prefill: int,
    decode: int,
    rollout: Rollout,
    routers: int,
    change: str,
    scales: list[tuple[int, EngineRole, int]],
    failures: list[tuple[int, str]],
    kills: list[tuple[int, int]],
    seed: int,
) -> None:
    rng = random.Random(seed)
    sim = up(shapes, {"prefill": prefill, "decode": decode}, rollout, routers, rng, not failures)
    old = sim.revision
    sim.kill(kills)
    roll_and_scale(sim, change, scales, failures)
    assert sim.revision != old
    sim.converge()


@st.composite
def canaries(draw: st.DrawFn) -> tuple[Rollout, int, int, int]:
    """A rollout policy, replicas and a canary percent the API accepts together (with maxSurge
    0 the canary's share must leave the old revision a replica of each role)."""
    rollout = draw(rollouts)
    if rollout.max_surge > 0:
        percent = draw(st.sampled_from([25, 50, 75]))
        return rollout, draw(replicas), draw(replicas), percent
    prefill, decode = draw(st.integers(2, 3)), draw(st.integers(2, 3))
    return rollout, prefill, decode, draw(st.sampled_from([25, 50]))


@SETTINGS
@given(
    shapes=role_shapes(),
    canary=canaries(),
    routers=st.integers(1, 2),
    hold=st.integers(0, 12),
    scale=st.none() | st.tuples(st.sampled_from(ENGINE_ROLES), replicas),
    failures=failure_sets,
    kills=kill_plans,
    seed=st.integers(0, 2**32 - 1),
)
def test_a_canary_of_groups_holds_then_is_promoted_keeping_every_check(
    shapes: dict[EngineRole, Shape],
    canary: tuple[Rollout, int, int, int],
    routers: int,
    hold: int,
    scale: tuple[EngineRole, int] | None,
    failures: list[tuple[int, str]],
    kills: list[tuple[int, int]],
    seed: int,
) -> None:
    rng = random.Random(seed)
    rollout, prefill, decode, percent = canary
    sim = up(shapes, {"prefill": prefill, "decode": decode}, rollout, routers, rng, not failures)
    old = sim.revision
    sim.kill(kills)

    def canary_on(spec: Obj) -> None:
        spec["speculative"]["numSpeculativeTokens"] = 2
        spec["rollout"]["canary"] = {"percent": percent}

    sim.edit(f"canary {percent}% with numSpeculativeTokens 2", canary_on)
    # Failures land in the roll's first steps and in the hold (counted from its start).
    early = ROLL_STEPS // 2
    sim.run(early, by_step((at, kind) for at, kind in failures if at < early))
    late = by_step((at - early, kind) for at, kind in failures if at >= early)
    sim.run_until(lambda: sim.phase in ("CanaryHold", "Complete"), HOLD_STEPS, "the hold")
    if sim.phase == "Complete":
        # Rolled out in full without a promotion: only where a failure took the anchor's last
        # group of a role (test_an_anchor_that_loses_its_last_group_keeps_the_canary_held).
        assert sim.failures, f"a canary completed unpromoted: {sim.log}"
        happened("a canary completed unpromoted after a failure")
        sim.converge()
        return
    happened("a canary held")
    for i in range(hold):
        if scale is not None and i == hold // 2:
            role, count = scale
            scaled = copy.deepcopy(sim.fc.body)
            scaled["spec"][role]["replicas"] = count
            if accepted(scaled):  # with maxSurge 0 the canary's budget may refuse it
                sim.scale(role, count)
        for kind in late.get(i, []):
            sim.inject(kind)
        serving = {s.revision for s in sim.states() if s.router.ready}
        if not sim.failures and sim.phase == "CanaryHold" and serving != {old, sim.revision}:
            sim.fail(f"held, but the serving revisions are {sorted(serving)}")
        sim.step()
    sim.promote()
    sim.converge()


@SETTINGS
@given(
    shapes=role_shapes(),
    prefill=replicas,
    decode=replicas,
    rollout=rollouts,
    routers=st.integers(1, 2),
    scales=st.lists(
        st.tuples(st.integers(0, ROLL_STEPS - 1), st.sampled_from(ENGINE_ROLES), replicas),
        min_size=1,
        max_size=4,
    ),
    failures=failure_sets,
    kills=kill_plans,
    seed=st.integers(0, 2**32 - 1),
)
def test_scaling_groups_up_and_down_with_failures_keeps_every_check(
    shapes: dict[EngineRole, Shape],
    prefill: int,
    decode: int,
    rollout: Rollout,
    routers: int,
    scales: list[tuple[int, EngineRole, int]],
    failures: list[tuple[int, str]],
    kills: list[tuple[int, int]],
    seed: int,
) -> None:
    rng = random.Random(seed)
    sim = up(shapes, {"prefill": prefill, "decode": decode}, rollout, routers, rng, not failures)
    sim.kill(kills)
    sim.play(scales, failures)
    sim.converge()


# ---- what the simulation found -----------------------------------------------------------------


def _held_canary(drain_seconds: int) -> tuple[Sim, str]:
    """Decode in 3-node groups, 2 replicas per role, a 50% canary held: the anchor keeps one
    decode group."""
    shapes = {"prefill": Shape(), "decode": Shape(3, "TensorParallel", 6)}
    obj = body(shapes, {"prefill": 2, "decode": 2}, Rollout((1, 0), drain_seconds), 1)
    sim = Sim.start(obj, shapes, random.Random(1), monitored=False)
    sim.run_until(lambda: sim.converged() is None, UP_STEPS, "the first rollout's completion")
    old = sim.revision

    def canary_on(spec: Obj) -> None:
        spec["speculative"]["numSpeculativeTokens"] = 2
        spec["rollout"]["canary"] = {"percent": 50}

    sim.edit("canary 50%", canary_on)
    sim.run_until(lambda: sim.phase == "CanaryHold", HOLD_STEPS, "the hold")
    return sim, old


def _break_a_member(sim: Sim, revision: str, role: EngineRole) -> None:
    """Delete rank 1 of the revision's first live group of the role."""
    found = [r for r in sim.found() if r.revision == revision and r.role == role and r.members]
    leader = sim.fc.pods[found[0].members[0]]
    url = url_of(leader)
    assert url is not None
    sim.injected.add(url)
    sim.failures += 1
    sim.log.append(f"t={sim.t - NOW:.0f}: delete {found[0].members[1]}")
    sim.fc.delete_pod(found[0].members[1])
    sim.changed()


def test_an_anchor_that_loses_its_last_group_keeps_the_canary_held() -> None:
    """A member of the anchor's one decode group fails during the hold: the group is replaced,
    and until someone promotes the canary the rollout must not complete, nor the anchor go."""
    sim, old = _held_canary(drain_seconds=30)
    _break_a_member(sim, old, "decode")
    for _ in range(60):
        sim.step()
        assert sim.phase != "Complete", f"the canary completed unpromoted: {sim.log}"
        assert any(labels(o).get(v.LABEL_REVISION) == old for o in sim.fc.objects.values()), (
            f"the anchor {old} was retired unpromoted: {sim.log}"
        )
    sim.run_until(
        lambda: (
            sim.phase == "CanaryHold"
            and any(s.revision == old and s.router.ready for s in sim.states())
        ),
        HOLD_STEPS,
        "the anchor serving again, the canary held",
    )


def _prefills_outlast_the_drain(sim: Sim, old: str, steps: int, drain: int = 30) -> float | None:
    """Step `steps` times, checking invariant 4 at each: `old`'s prefill pods stay at least
    `drain` seconds after it stopped taking traffic. When it stopped (None: it never did)."""
    stopped: float | None = None
    for _ in range(steps):
        sim.step()
        if stopped is None and not any(s.revision == old and s.router.ready for s in sim.states()):
            stopped = sim.t
        prefills = [
            n
            for n, p in sim.fc.pods.items()
            if labels(p).get(v.LABEL_REVISION) == old
            and labels(p).get(v.LABEL_ROLE) == "prefill"
            and not sim.fc.terminating(n)
        ]
        if stopped is not None and sim.t < stopped + drain:
            assert prefills, (
                f"the old prefill pods went {sim.t - stopped:.0f}s after {old} stopped taking "
                f"traffic, drainSeconds is {drain}: {sim.log}"
            )
    return stopped


def test_a_revision_unrouted_by_a_broken_group_keeps_its_pods_for_the_drain() -> None:
    """Invariant 4: an old revision's pods stay drainSeconds after its traffic stopped, here
    when it stopped because its last decode group broke."""
    sim, old = _held_canary(drain_seconds=30)
    _break_a_member(sim, old, "decode")
    _prefills_outlast_the_drain(sim, old, 40)


def test_an_old_revision_whose_last_group_breaks_mid_roll_drains_before_it_goes() -> None:
    """A plain roll (no canary): the old revision's one decode group breaks while both revisions
    serve. Whether the planner then drains it or waits for its group, its prefill pods stay at
    least drainSeconds after it stopped taking traffic (invariant 4)."""
    shapes = {"prefill": Shape(), "decode": Shape(3, "TensorParallel", 6)}
    obj = body(shapes, {"prefill": 1, "decode": 1}, Rollout((1, 0), 30), 1)
    sim = Sim.start(obj, shapes, random.Random(2), monitored=False)
    sim.run_until(lambda: sim.converged() is None, UP_STEPS, "the first rollout's completion")
    old = sim.revision

    def bump(spec: Obj) -> None:
        spec["speculative"]["numSpeculativeTokens"] = 2

    sim.edit("k=2", bump)

    def both_serve() -> bool:
        serving = {s.revision for s in sim.states() if s.router.ready}
        return old in serving and len(serving) == 2

    sim.run_until(both_serve, HOLD_STEPS, "both revisions serving")
    _break_a_member(sim, old, "decode")
    stopped = _prefills_outlast_the_drain(sim, old, 120)
    assert stopped is not None, f"{old} never stopped serving: {sim.log}"
    sim.run_until(lambda: sim.converged() is None, CONVERGE_STEPS, "convergence")

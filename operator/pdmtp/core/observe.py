"""The one observation layer: plain API dicts in, the facts the core decides on out.

Everything that reads a pod or a Deployment lives here: readiness, the planner's view of revisions,
a router's engine membership, pods that explain a stall or a failure. The reconcile, the router
rendering and the tests' invariant watcher all read the cluster through these functions.

Pods are counted from pods, not from Deployment status: terminating pods still hold GPUs (the
surge ceiling counts them) and a Deployment's status lags its pods.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, get_args

from pdmtp.api import vocabulary as v
from pdmtp.api.status import WaitReason
from pdmtp.core.hashing import short_hash
from pdmtp.core.planner import RevisionState, RoleState, steady_listing
from pdmtp.core.removal import EnginePod, RouterPod, Waiting, listed_urls

Obj = Mapping[str, Any]
RoleKey = tuple[str, str]
"""(revision, role)."""
MEMBERSHIP_TOKEN_LENGTH = 16


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


def name_of(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def is_terminating(obj: Obj) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def pod_ready(pod: Obj) -> bool:
    """Running, Ready and not on its way out: the only pods that may take traffic."""
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or is_terminating(pod):
        return False
    conditions = status.get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def is_leaving(pod: Obj) -> bool:
    """Marked to leave routing before it is removed (`core.removal`)."""
    return v.ANNOTATION_LEAVING in annotations_of(pod)


def serves(pod: Obj) -> bool:
    """Ready and not leaving: counted as serving capacity and listed by its routers."""
    return pod_ready(pod) and not is_leaving(pod)


# ---- pods that explain a stall or a failure -------------------------------------------------


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


# ---- the planner's view ---------------------------------------------------------------------


def _parked_replicas(deployment: Obj) -> int:
    """The replicas the planner asked of a router held at zero (render.router_deployment)."""
    parked = annotations_of(deployment).get(v.ANNOTATION_ROUTER_PARKED, "")
    return int(parked) if parked.isdigit() else 0


def _parked(deployment: Obj) -> bool:
    replicas = int((deployment.get("spec") or {}).get("replicas") or 0)
    return replicas == 0 and _parked_replicas(deployment) > 0


def _role_state(
    deployment: Obj | None,
    pods: list[Obj],
    routed: frozenset[str] | None = None,
    steady: frozenset[str] | None = None,
) -> RoleState:
    """One (revision, role) as the planner counts it; for an engine role, `routed` holds the
    engine URLs its revision's Ready router pods list (None for the router role itself) and
    `steady` those its router keeps listed through its own rollout (None: no router
    Deployment; `planner.steady_listing`)."""
    replicas = int(((deployment or {}).get("spec") or {}).get("replicas") or 0)
    if deployment is not None and replicas == 0:
        # A parked router keeps the planner's intent (render.router_deployment).
        replicas = _parked_replicas(deployment)
    ready = sum(serves(p) for p in pods)
    if routed is None:
        return RoleState(replicas, len(pods), ready)
    listed = [p for p in pods if pod_ready(p) and _url_of(p) in routed]
    staying = [p for p in listed if not is_leaving(p)]
    return RoleState(
        replicas,
        len(pods),
        ready,
        unlisted=ready - len(staying),
        still_listed=len(listed) - len(staying),
        dropping=0 if steady is None else sum(_url_of(p) not in steady for p in staying),
    )


def _url_of(pod: Obj) -> str | None:
    ip = (pod.get("status") or {}).get("podIP")
    return engine_url(ip) if ip else None


def ready_listings(router_pods: Iterable[Obj]) -> list[frozenset[str]]:
    """The engine URLs each Ready router pod among `router_pods` lists; their union is what
    clients reach (a router pod that is not Ready, or is terminating, is out of its Service)."""
    return [router_urls(_container_args(p.get("spec") or {})) for p in router_pods if pod_ready(p)]


def _steady_urls(router: Obj | None, listings: list[frozenset[str]]) -> frozenset[str] | None:
    """The engine URLs `router` keeps listed through its own rollout (`steady_listing`), given
    what its Ready pods list."""
    if router is None:
        return None
    spec = router.get("spec") or {}
    template = router_urls(_container_args((spec.get("template") or {}).get("spec") or {}))
    replicas = int(spec.get("replicas") or 0) or _parked_replicas(router)
    return steady_listing(listings, template, replicas)


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
            for r in v.ROLES
            if (rev, r) in by_workload
        ]
        router = by_workload.get((rev, "router"))
        drain = parse_time(annotations_of(router).get(v.ANNOTATION_DRAIN_UNTIL)) if router else None
        listings = ready_listings(pods_of.get((rev, "router"), []))
        routed = frozenset[str]().union(*listings)
        steady = _steady_urls(router, listings)
        roles = {
            r: _role_state(
                by_workload.get((rev, r)),
                pods_of.get((rev, r), []),
                routed if r in v.ENGINE_ROLES else None,
                steady,
            )
            for r in v.ROLES
        }
        states.append(
            RevisionState(
                revision=rev,
                prefill=roles["prefill"],
                decode=roles["decode"],
                router=roles["router"],
                drain_until=drain,
                created=min((c for c in created if c is not None), default=float("inf")),
                router_parked=router is not None and _parked(router),
            )
        )
    return sorted(states, key=lambda s: (s.created, s.revision))


# ---- a router's engines ---------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Prefill:
    """A prefill engine as the router addresses it."""

    url: str
    bootstrap_port: int


@dataclass(frozen=True)
class Membership:
    """The engines one revision's router may route to, read from observed pods."""

    prefills: tuple[Prefill, ...]
    decodes: tuple[str, ...]
    token: str
    """Changes whenever the router must restart: membership, or a prefill engine restarted."""

    @property
    def routable(self) -> bool:
        return bool(self.prefills) and bool(self.decodes)


def pod_url(ip: str, port: int) -> str:
    """`http://<pod IP>:<port>`, an IPv6 address bracketed (only IPv6 has colons)."""
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}"


def engine_url(ip: str) -> str:
    """The URL of an engine pod's OpenAI server."""
    return pod_url(ip, v.ENGINE_HTTP_PORT)


def _restarts(pod: Obj) -> int:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return sum(int(s.get("restartCount", 0)) for s in statuses)


def revision_membership(
    pods: Iterable[Obj],
    *,
    deployment_name: str,
    revision: str,
    bootstrap_port: int = v.DEFAULT_BOOTSTRAP_PORT,
    leaving: frozenset[str] = frozenset(),
) -> Membership:
    """Pick the Ready engine pods of exactly one (deployment, revision) from pod objects (dicts),
    leaving out those marked to leave (observed, or named in `leaving`: this step's marks).

    A pod of another revision or deployment is never selected, whatever else it carries, so a
    router can never pair across revisions. The order is stable (sorted), so the same pods always
    render the same arguments and an unchanged revision never rolls its router.
    """
    prefills: list[Prefill] = []
    decodes: list[str] = []
    identity: list[str] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(v.LABEL_NAME) != deployment_name or labels.get(v.LABEL_REVISION) != revision:
            continue
        role = labels.get(v.LABEL_ROLE)
        ip = (pod.get("status") or {}).get("podIP")
        if role not in v.ENGINE_ROLES or not ip or not serves(pod):
            continue
        if meta.get("name") in leaving:
            continue
        url = engine_url(ip)
        if role == "prefill":
            annotated = (meta.get("annotations") or {}).get(v.ANNOTATION_BOOTSTRAP_PORT)
            port = int(annotated) if annotated else bootstrap_port
            prefills.append(Prefill(url, port))
            # vLLM mints a new engine_id whenever a prefill engine starts; the router learns ids
            # only at its own start, so a prefill container restart must restart the router.
            identity.append(f"p {url} {port} {meta.get('uid', '')} {_restarts(pod)}")
        else:
            decodes.append(url)
            identity.append(f"d {url}")
    token = short_hash("\n".join(sorted(identity)), MEMBERSHIP_TOKEN_LENGTH)
    return Membership(tuple(sorted(prefills)), tuple(sorted(decodes)), token)


# ---- what removal needs ---------------------------------------------------------------------


def router_urls(args: Iterable[str]) -> frozenset[str]:
    """The engine URLs a router's args list (`--prefill URL [PORT]`, `--decode URL`)."""
    args = list(args)
    return frozenset(args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--prefill", "--decode"))


def _container_args(pod_spec: Obj) -> list[str]:
    containers = pod_spec.get("containers") or [{}]
    return list(containers[0].get("args") or [])


UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
"""The taint the node controller puts on a cordoned node (`kubectl cordon`, `kubectl drain`)."""


def cordoned_nodes(nodes: Iterable[Obj]) -> frozenset[str]:
    """Nodes marked unschedulable (cordoned, as a drain begins)."""
    out = set()
    for node in nodes:
        spec = node.get("spec") or {}
        taints = spec.get("taints") or []
        if spec.get("unschedulable") or any(t.get("key") == UNSCHEDULABLE_TAINT for t in taints):
            out.add(name_of(node))
    return frozenset(out)


def removal_view(
    pods: Iterable[Obj],
    cordoned: frozenset[str] = frozenset(),
    replacing: Collection[str] = frozenset(),
) -> tuple[list[EnginePod], list[RouterPod]]:
    """One PDDeployment's live engine pods and all its router pods (terminating ones too: they
    serve through their preStop), as `core.removal` decides over them; an engine pod on a
    `cordoned` node, or one the operator is `replacing`, is to be moved (`core.evacuation`)."""
    engines: list[EnginePod] = []
    routers: list[RouterPod] = []
    for pod in pods:
        labels = labels_of(pod)
        revision, role = labels.get(v.LABEL_REVISION, ""), labels.get(v.LABEL_ROLE)
        if role == "router":
            routers.append(RouterPod(revision, router_urls(_container_args(pod.get("spec") or {}))))
        elif role in v.ENGINE_ROLES and not is_terminating(pod):
            ip = (pod.get("status") or {}).get("podIP")
            meta = pod.get("metadata") or {}
            notes = annotations_of(pod)
            engines.append(
                EnginePod(
                    name=name_of(pod),
                    revision=revision,
                    role=role,
                    url=engine_url(ip) if ip else None,
                    ready=pod_ready(pod),
                    leaving=is_leaving(pod),
                    released=notes.get(v.ANNOTATION_DELETION_COST) == v.RELEASED_DELETION_COST,
                    created=parse_time(meta.get("creationTimestamp")) or 0.0,
                    template=labels.get("pod-template-hash", ""),
                    evacuate=(pod.get("spec") or {}).get("nodeName") in cordoned
                    or name_of(pod) in replacing,
                )
            )
    return engines, routers


def listed_engines(pods: Iterable[Obj]) -> dict[str, frozenset[str]]:
    """Per revision, the engine pods (by name, terminating ones too) that some router pod of that
    revision, terminating ones too, lists: invariant 8's view (`core.invariants`)."""
    pods = list(pods)
    urls = listed_urls(removal_view(pods)[1])
    out: dict[str, set[str]] = {}
    for pod in pods:
        labels = labels_of(pod)
        revision, ip = labels.get(v.LABEL_REVISION, ""), (pod.get("status") or {}).get("podIP")
        listed = ip and engine_url(ip) in urls.get(revision, frozenset())
        if labels.get(v.LABEL_ROLE) in v.ENGINE_ROLES and listed:
            out.setdefault(revision, set()).add(name_of(pod))
    return {rev: frozenset(names) for rev, names in out.items()}


# ---- what a step waits for ------------------------------------------------------------------

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


def _wait(obj: Obj, kind: str, reason: WaitReason, message: str, stuck: bool) -> Wait:
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
            return _wait(pod, "Pod", "ImagePull", said, stuck=True)
        ended = (c.get("lastState") or {}).get("terminated") or {}
        # Restarted and not Ready again: named as a crash loop between restarts too, so the
        # fact does not come and go with each restart (each return would be news).
        if why == "CrashLoopBackOff" or (restarts and ended):
            last = ended.get("message") or ended.get("reason") or "no message"
            text = f"container {name}: {restarts} restart(s), last: {last}"
            return _wait(pod, "Pod", "CrashLoop", text, stuck=True)
        if why and why not in _STARTING:
            return _wait(pod, "Pod", "ContainerError", said, stuck=True)
    return None


def _ready_since(pod: Obj) -> str | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("lastTransitionTime"):
            return str(c["lastTransitionTime"])
    created = (pod.get("metadata") or {}).get("creationTimestamp")
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
            out.append(_wait(pod, "Pod", "Unschedulable", str(unplaced.get("message", "")), True))
            continue
        held = _container_wait(pod)
        if held is not None:
            out.append(held)
            continue
        since = _ready_since(pod)
        when = f" since {since}" if since else ""
        if (pod.get("status") or {}).get("phase") == "Running":
            out.append(_wait(pod, "Pod", "NotReady", f"running, not Ready{when}", False))
        else:
            out.append(_wait(pod, "Pod", "Starting", f"Pending{when}", False))
    return out


def drain_waits(deployments: Iterable[Obj], now: float) -> list[Wait]:
    """Router Deployments whose revision drains (traffic off) until a time still to come."""
    out = []
    for d in deployments:
        if labels_of(d).get(v.LABEL_ROLE) != "router" or is_terminating(d):
            continue
        until = annotations_of(d).get(v.ANNOTATION_DRAIN_UNTIL)
        end = parse_time(until)
        if until and end is not None and end > now:
            text = f"traffic stopped; the revision's pods drain until {until}"
            out.append(_wait(d, "Deployment", "Draining", text, False))
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
    that may surge (the operator moves a cordoned node's pods itself, `core.budgets`), so one
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
        out.append(_wait(b, v.DISRUPTION_BUDGET_KIND, "DisruptionBudget", text, key in stuck_roles))
    return out


def listed_waits(waiting: Iterable[Waiting]) -> list[Wait]:
    """Leaving pods the removal gate holds because router pods still list them."""
    return [
        Wait(
            f"Pod/{w.pod}",
            w.revision,
            w.role,
            "ListedByRouter",
            f"leaving; {w.routers} router pod(s) of {w.revision} still list it",
            False,
        )
        for w in waiting
    ]


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
    gated: Iterable[Waiting] = (),
    cordoned: Collection[str] = frozenset(),
) -> tuple[Wait, ...]:
    """Everything an unfinished step may wait for, across all revisions and roles (routers and
    the anchor revision too), ordered: pods not Ready and why, disruption budgets that hold a
    drain off a `cordoned` node, leaving pods the removal gate holds (`gated`), drains still
    running."""
    pods = list(pods)
    held = pod_waits(pods)
    draining = draining_roles(pods, cordoned)
    return ordered(
        [
            *held,
            *budget_waits(budgets, held, draining),
            *listed_waits(gated),
            *drain_waits(deployments, now),
        ]
    )


class Named(Protocol):
    """A fact as `describe` names it (a `Wait`, or one read back from the status)."""

    @property
    def object(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def message(self) -> str: ...


def describe(facts: Sequence[Named], limit: int = 3) -> str:
    """The first `limit` facts in words, and how many more: a bounded message."""
    named = ", ".join(f"{w.object} ({w.reason}: {w.message})" for w in facts[:limit])
    more = len(facts) - limit
    return named + (f" and {more} more" if more > 0 else "")

"""A pod leaves routing before it leaves the cluster.

The planner says how many pods each (revision, role) keeps. A Deployment whose replicas drop has
its ReplicaSet delete pods at once, while the revision's routers still send to them by URL
(docs/router.md): every such request fails. So where a router may list the pods, removal takes
three steps, each decided here from what is observed:

1. **mark**: pick the victims and annotate them `pdmtp.io/leaving`; the routers' membership
   leaves them out, so the revision's routers roll to args without them;
2. **release**: once no router pod of the revision, terminating ones included (they serve through
   their preStop), lists a victim, give it the lowest `controller.kubernetes.io/pod-deletion-cost`
   so the ReplicaSet deletes exactly it and no pod a router still sends to;
3. **scale**: once the release is observed, drop the replicas; a victim's own stop (preStop, then
   vLLM's --shutdown-timeout) finishes the requests it already accepted.

Victims are chosen as the ReplicaSet would rank them, so a pod that is not ready (and listed by no
router) goes first. A mark the planner no longer needs (a scale-up came first) is removed and the
pod returns to routing.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from pdmtp.api import vocabulary as v
from pdmtp.api.vocabulary import ENGINE_ROLES, EngineRole
from pdmtp.core.objects import (
    Obj,
    annotations_of,
    engine_url,
    is_leaving,
    is_terminating,
    labels_of,
    name_of,
    parse_time,
    pod_ready,
)
from pdmtp.core.pods import Wait
from pdmtp.core.render.membership import container_args, router_urls
from pdmtp.core.revision_state import RevisionState
from pdmtp.core.rollout.planner import RevisionPlan


@dataclass(frozen=True)
class EnginePod:
    """An engine pod as removal sees it (terminating pods are left out by the caller)."""

    name: str
    revision: str
    role: EngineRole
    url: str | None
    """Where a router would send to it; None before it has an IP (no router can list it)."""
    ready: bool
    leaving: bool
    """Carries the leaving mark (observed)."""
    released: bool
    """Carries the lowest deletion cost (observed)."""
    created: float
    template: str = ""
    """Its ReplicaSet's pod-template-hash: pods of an older template go first."""
    evacuate: bool = False
    """On a cordoned node (a drain under way), or being replaced: it goes first
    (`core.rollout.evacuation`)."""
    broken: bool = False
    """Being replaced because its KV pulls keep failing (`pdmtp.io/replace`): not capacity, so
    out of routing at once while another pod of its revision and role serves (`_broken_out`)."""


@dataclass(frozen=True)
class RouterPod:
    """A router pod, terminating or not, and the engine URLs its args list."""

    revision: str
    lists: frozenset[str]


@dataclass(frozen=True)
class Waiting:
    """A victim whose removal waits for routers that still list it."""

    pod: str
    revision: str
    role: EngineRole
    routers: int


@dataclass(frozen=True)
class Removal:
    """The planner's step made safe: replicas held until their victims are out of every router's
    list and released, and the marks each engine pod should carry after this step."""

    plans: tuple[RevisionPlan, ...]
    leaving: frozenset[str]
    """Out of routing (the leaving mark)."""
    released: frozenset[str]
    """Leaving and listed by no router: the ReplicaSet may delete them (lowest deletion cost)."""
    waiting: tuple[Waiting, ...] = ()

    def changes(self, engines: Iterable[EnginePod]) -> list[tuple[str, bool, bool]]:
        """(pod, leaving, released) for every engine pod whose marks must change."""
        return [
            (e.name, e.name in self.leaving, e.name in self.released)
            for e in sorted(engines, key=lambda e: e.name)
            if (e.leaving, e.released) != (e.name in self.leaving, e.name in self.released)
        ]


def _victim_order(pods: Sequence[EnginePod]) -> list[EnginePod]:
    """Marked first (a choice once made stays), then those on a cordoned node (a drain waits for
    them), then as the ReplicaSet ranks: not ready, an older template than the newest pod's,
    then the newest."""
    newest = max(pods, key=lambda p: p.created).template if pods else ""
    return sorted(
        pods,
        key=lambda p: (
            not p.leaving,
            not p.evacuate,
            p.ready,
            p.template == newest,
            -p.created,
            p.name,
        ),
    )


def gate(
    plans: Sequence[RevisionPlan],
    states: Sequence[RevisionState],
    engines: Sequence[EnginePod],
    routers: Sequence[RouterPod],
) -> Removal:
    """Hold each planned scale-down until its victims are out of every router's list."""
    state_of = {s.revision: s for s in states}
    listed = listed_urls(routers)
    out: list[RevisionPlan] = []
    leaving: set[str] = set()
    released: set[str] = set()
    waiting: list[Waiting] = []
    for p in plans:
        state = state_of.get(p.revision)
        if p.delete or state is None:
            out.append(p)
            continue
        held: dict[EngineRole, int] = {}
        routed = p.router > 0 or p.revision in listed
        for role in ENGINE_ROLES:
            live = [e for e in engines if e.revision == p.revision and e.role == role]
            want, current = p.replicas(role), state.role(role).replicas
            victims = _victims(live, want, current, routed)
            urls = listed.get(p.revision, frozenset())
            blocked = [v for v in victims if v.url is not None and v.url in urls]
            free = [v for v in victims if v not in blocked]
            leaving.update(v.name for v in victims)
            if routed:
                leaving.update(_broken_out(live))
            released.update(v.name for v in free)
            gone = sum(v.released for v in free)
            if routed and want < current and gone < len(victims):
                held[role] = min(current, max(want, len(live) - gone))
                routers_of = [r for r in routers if r.revision == p.revision]
                waiting += [
                    Waiting(v.name, p.revision, role, sum(v.url in r.lists for r in routers_of))
                    for v in blocked
                ]
        prefill, decode = held.get("prefill", p.prefill), held.get("decode", p.decode)
        out.append(replace(p, prefill=prefill, decode=decode))
    return Removal(tuple(out), frozenset(leaving), frozenset(released), tuple(waiting))


def _broken_out(live: Sequence[EnginePod]) -> list[str]:
    """The pods of one revision and role whose pulls keep failing that leave routing now, before
    their replacement is Ready: every request a router sends one fails (loadFailurePolicy fail)
    or is recomputed at the decode's cost, so it is not capacity. They go while another pod of
    theirs is Ready and routed to take the requests; with none (a role of one), the broken pod
    keeps serving until its replacement is listed, as before."""
    if not any(e.ready and not e.leaving and not e.broken for e in live):
        return []
    return [e.name for e in live if e.broken]


def _victims(live: Sequence[EnginePod], want: int, current: int, routed: bool) -> list[EnginePod]:
    """The pods that must be out of routing: those a planned scale-down removes, or (already
    marked) those the ReplicaSet is about to delete after one."""
    if want < current and routed:
        return _victim_order(live)[: max(len(live) - want, 0)]
    if current < len(live):
        # Scaled already, the ReplicaSet has not deleted yet: keep the marks that are there
        # (pods beyond the replicas may also be a rolling update's surge, which marks nothing).
        return [e for e in _victim_order(live) if e.leaving][: len(live) - current]
    return []


def listed_urls(routers: Iterable[RouterPod]) -> Mapping[str, frozenset[str]]:
    """Per revision, every engine URL some router pod of it lists."""
    out: dict[str, set[str]] = {}
    for r in routers:
        out.setdefault(r.revision, set()).update(r.lists)
    return {rev: frozenset(urls) for rev, urls in out.items()}


def removal_view(
    pods: Iterable[Obj],
    cordoned: frozenset[str] = frozenset(),
    replacing: Collection[str] = frozenset(),
) -> tuple[list[EnginePod], list[RouterPod]]:
    """One PDDeployment's live engine pods and all its router pods (terminating ones too: they
    serve through their preStop), as `core.rollout.removal` decides over them; an engine pod on a
    `cordoned` node, or one the operator is `replacing`, is to be moved
    (`core.rollout.evacuation`)."""
    engines: list[EnginePod] = []
    routers: list[RouterPod] = []
    for pod in pods:
        labels = labels_of(pod)
        revision, role = labels.get(v.LABEL_REVISION, ""), labels.get(v.LABEL_ROLE)
        if role == "router":
            routers.append(RouterPod(revision, router_urls(container_args(pod.get("spec") or {}))))
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
                    broken=name_of(pod) in replacing,
                )
            )
    return engines, routers


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

"""The controller's watch side: reflectors (`pdmtp.cache`) list and watch the PDDeployments, every
child kind pdmtp manages and the Nodes into in-memory stores, and say which PDDeployment to look
at again. A reconcile reads its PDDeployment's children from here (`observed`), never from the
API. The Workload API's version is discovered here too: the PodGroups are watched at it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pdmtp.api import vocabulary as v
from pdmtp.api.kinds import DEPLOYMENT, NODE, PDDEPLOYMENT, POD, POD_GROUP, WATCHED, Kind
from pdmtp.cache import ChildStore, Reflector, Table, wait_synced
from pdmtp.core.context import Observed
from pdmtp.core.objects import Key, cordoned_nodes
from pdmtp.core.windows import PodMetrics
from pdmtp.health import Watch
from pdmtp.kube import ApiError, Kube
from pdmtp.metrics import Metrics

log = logging.getLogger("pdmtp")


def spans_nodes(body: Mapping[str, Any] | None) -> bool:
    """Whether a PDDeployment asks for a multi-node role (it needs the Workload API)."""
    spec = (body or {}).get("spec") or {}
    return any(isinstance(spec.get(r), dict) and "multiNode" in spec[r] for r in v.ENGINE_ROLES)


@dataclass
class Watches:
    kube: Kube
    metrics: Metrics
    namespaces: tuple[str, ...] = ()
    """Empty: all namespaces."""
    pdds: Table = field(default_factory=Table)
    """PDDeployments, from their reflectors' watches."""
    store: ChildStore = field(default_factory=ChildStore)
    """Children, from the reflectors' watches."""
    nodes: Table = field(default_factory=Table)
    """Every Node: for the cordons a drain begins with."""
    cordoned: frozenset[str] = frozenset()
    workload_api: str | None = None
    """The Workload API version the API server serves (`scheduling.k8s.io/v1beta1`), None when it
    serves none: discovered at start, and while it is None at every resync that finds a
    multi-node spec waiting for it (so an idle resync makes no request)."""
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once every child kind and the Nodes are listed: no reconcile before (an empty store
    would read as "nothing exists" and re-create what is there)."""
    pdd_reflectors: list[Reflector] = field(default_factory=list)
    reflectors: list[Reflector] = field(default_factory=list)

    async def start(
        self,
        on_pdd: Callable[[Key], None],
        on_child: Callable[[Key], None],
        on_nodes: Callable[[], None],
    ) -> None:
        """Start every reflector; the callbacks run on this event loop, with the owning
        PDDeployment's key (`on_nodes`: a Node changed)."""
        loop = asyncio.get_running_loop()

        def on_loop(callback: Callable[[Key], None]) -> Callable[[Key], None]:
            def call(key: Key) -> None:  # from a reflector's thread
                loop.call_soon_threadsafe(callback, key)

            return call

        def count(kind: str, verb: str) -> None:
            self.metrics.watch_requests.labels(kind, verb).inc()

        scopes: list[str | None] = list(self.namespaces) or [None]
        for namespace in scopes:
            # Every PDDeployment, not only labelled ones; retried until the API serves them.
            reflector = Reflector(
                self.kube.api,
                PDDEPLOYMENT,
                namespace,
                self.pdds,
                on_loop(on_pdd),
                count,
                selector=None,
            )
            self.metrics.watched.labels(PDDEPLOYMENT.plural, namespace or "").set_function(
                reflector.watching_value
            )
            self.pdd_reflectors.append(reflector)
        await asyncio.to_thread(self.discover_workload_api)
        self.reflectors.append(
            Reflector(
                self.kube.api,
                NODE,
                None,
                self.nodes,
                on_loop(lambda _: on_nodes()),
                count,
                selector=None,
            )
        )
        for kind in WATCHED:
            for namespace in scopes:
                self.reflectors.append(
                    Reflector(
                        self.kube.api,
                        self._served(kind),
                        namespace,
                        self.store,
                        on_loop(on_child),
                        count,
                    )
                )
        for reflector in (*self.pdd_reflectors, *self.reflectors):
            reflector.start()

    async def await_sync(self) -> None:
        while not await asyncio.to_thread(wait_synced, self.reflectors, 5.0):
            log.info("Waiting for the child caches to sync")
        log.info("Child caches synced: %d objects", self.store.size())
        self.synced.set()

    def stop(self) -> None:
        for reflector in (*self.pdd_reflectors, *self.reflectors):
            reflector.stop()

    def discover_workload_api(self) -> None:
        """Which Workload API version the server serves PodGroups at (None: none). The kube
        adapter then addresses PodGroups there; rendering names it in their apiVersion."""
        try:
            served = self.kube.served_version(
                v.WORKLOAD_API_GROUP, v.WORKLOAD_API_VERSIONS, v.POD_GROUP_PLURAL
            )
        except ApiError as e:
            log.warning("Discovery of %s failed: %s", v.WORKLOAD_API_GROUP, e.message)
            return  # keep what was known
        found = None if served is None else f"{v.WORKLOAD_API_GROUP}/{served}"
        if found != self.workload_api:
            log.info("Workload API: %s", found or f"not served ({v.WORKLOAD_API_GROUP})")
        self.workload_api = found
        if served is not None:
            self.kube.versions[POD_GROUP.kind] = served

    def _served(self, kind: Kind) -> Kind:
        """`kind` at the version the server serves it (the Workload API's may differ)."""
        served = self.kube.versions.get(kind.kind)
        return kind if served is None else dataclasses.replace(kind, version=served)

    def update_cordons(self) -> bool:
        """Read the cordoned Nodes again; whether the set changed."""
        nodes = (self.nodes.get(k) for k in self.nodes.snapshot())
        cordoned = cordoned_nodes(n for n in nodes if n is not None)
        if cordoned == self.cordoned:
            return False
        log.info("Cordoned nodes: %s", ", ".join(sorted(cordoned)) or "none")
        self.cordoned = cordoned
        return True

    def held(self, kind: str, namespace: str, name: str) -> str | None:
        """The resourceVersion the caches hold of an object (None: not there)."""
        if kind == PDDEPLOYMENT.kind:
            return self.pdds.held(namespace, name)
        return self.store.held(kind, namespace, name)

    def observed(
        self, body: Mapping[str, Any], key: Key, metrics: Mapping[str, PodMetrics]
    ) -> Observed:
        """The PDDeployment and its children as the caches hold them (no API request), with its
        engines' `metrics` as last scraped."""
        children = self.store.children(*key)
        # Every watched kind reaches the core: the two it reads apart, the rest as `others`.
        others = [
            o for k in WATCHED if k not in (DEPLOYMENT, POD) for o in children.get(k.kind, [])
        ]
        return Observed(
            body,
            children.get(DEPLOYMENT.kind, []),
            children.get(POD.kind, []),
            others,
            metrics,
            self.workload_api,
            self.cordoned,
        )

    def pdd_watches(self, now: float) -> list[Watch]:
        """The PDDeployment watches, as liveness judges them (`pdmtp.health`)."""
        return [
            Watch(
                r.kind.plural,
                r.namespace or "all namespaces",
                r.watching,
                round(now - r.changed_at, 1),
                r.last_error,
            )
            for r in self.pdd_reflectors
        ]

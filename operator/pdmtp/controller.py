"""The kopf shell: watch, queue, observe -> core.decide -> apply -> status. No decisions here.

kopf watches PDDeployments; reflectors (`pdmtp.cache`) watch every child kind pdmtp manages into
an in-memory store. Every event only puts the owning PDDeployment's key on a work queue. Workers
take one key at a time (a key is never worked on twice at once), read its children from the
store (no API request), call `pdmtp.core.reconcile.decide`, apply the actions (keeping going past
a refusal), write the status once if it changed, with the refused writes in it, and post the
events of what was accepted after that write. A periodic resync re-queues every key. Only raw
watch events are used (`kopf.on.event`): kopf keeps no bookkeeping on the objects, adds no
finalizer, and a restart rebuilds everything from the initial listings.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from pdmtp.api import vocabulary as v
from pdmtp.api.kinds import DEPLOYMENT, POD, WATCHED
from pdmtp.cache import ChildStore, Reflector, wait_synced
from pdmtp.core.actions import Action, Annotate, Apply, Delete, Event, Rejection, Scale
from pdmtp.core.reconcile import Observed, decide
from pdmtp.core.validation import validate
from pdmtp.kube import ApiError, Kube
from pdmtp.metrics import Metrics
from pdmtp.webhook import MANAGED_CONFIGURATION, WebhookOptions, server

log = logging.getLogger("pdmtp")

Key = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class Options:
    namespaces: tuple[str, ...] = ()
    """Empty: all namespaces."""
    resync_seconds: float = 30.0
    workers: int = 4
    max_backoff_seconds: float = 30.0
    sync_timeout_seconds: float = 120.0


class WritesRefused(Exception):
    """Some of a reconcile's writes were refused; the key is retried with backoff."""


class WorkQueue:
    """Deduplicating queue: a key waits at most once, and is never handed to two workers."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._waiting: set[Key] = set()
        self._active: set[Key] = set()
        self._dirty: set[Key] = set()

    def add(self, key: Key) -> None:
        if key in self._active:
            self._dirty.add(key)  # re-run once the current pass ends
        elif key not in self._waiting:
            self._waiting.add(key)
            self._queue.put_nowait(key)

    def add_after(self, key: Key, delay: float) -> None:
        asyncio.get_running_loop().call_later(delay, self.add, key)

    async def get(self) -> Key:
        key = await self._queue.get()
        self._waiting.discard(key)
        self._active.add(key)
        return key

    def done(self, key: Key) -> None:
        self._active.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def __len__(self) -> int:
        return len(self._waiting)


@dataclass
class Controller:
    kube: Kube
    options: Options
    metrics: Metrics
    queue: WorkQueue = field(default_factory=WorkQueue)
    cache: dict[Key, dict[str, Any]] = field(default_factory=dict)
    """PDDeployments, from kopf's watch."""
    store: ChildStore = field(default_factory=ChildStore)
    """Children, from the reflectors' watches."""
    failures: dict[Key, int] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    reflectors: list[Reflector] = field(default_factory=list)
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    events: asyncio.Queue[tuple[Mapping[str, Any], Event]] = field(default_factory=asyncio.Queue)

    # ---- watch side -----------------------------------------------------------------------

    def on_pdd_event(self, event: Mapping[str, Any]) -> None:
        body = event.get("object") or {}
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if event.get("type") == "DELETED":
            self.cache.pop(key, None)
            self.failures.pop(key, None)
            self.metrics.forget(*key)
            return
        self.cache[key] = dict(body)
        self.queue.add(key)

    def on_child_change(self, key: Key) -> None:
        if key in self.cache:
            self.queue.add(key)

    # ---- work side ------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()

        def notify(key: Key) -> None:  # called from reflector threads
            loop.call_soon_threadsafe(self.on_child_change, key)

        scopes: list[str | None] = list(self.options.namespaces) or [None]
        for kind in WATCHED:
            for namespace in scopes:
                reflector = Reflector(
                    self.kube.api,
                    kind,
                    namespace,
                    self.store,
                    notify,
                    on_request=lambda k, verb: self.metrics.watch_requests.labels(k, verb).inc(),
                )
                reflector.start()
                self.reflectors.append(reflector)
        self.tasks.append(asyncio.create_task(self._await_sync(), name="pdmtp-sync"))
        for i in range(self.options.workers):
            self.tasks.append(asyncio.create_task(self._worker(), name=f"pdmtp-worker-{i}"))
        self.tasks.append(asyncio.create_task(self._resync(), name="pdmtp-resync"))
        self.tasks.append(asyncio.create_task(self._poster(), name="pdmtp-events"))

    async def _await_sync(self) -> None:
        # No reconcile before every child kind is listed: an empty store would read as
        # "nothing exists" and re-create what is there.
        while not await asyncio.to_thread(wait_synced, self.reflectors, 5.0):
            log.info("Waiting for the child caches to sync")
        log.info("Child caches synced: %d objects", self.store.size())
        self.synced.set()

    async def stop(self) -> None:
        for reflector in self.reflectors:
            reflector.stop()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.options.resync_seconds)
            self.metrics.cached_objects.set(self.store.size())
            for key in list(self.cache):
                self.queue.add(key)

    async def _worker(self) -> None:
        await self.synced.wait()
        while True:
            key = await self.queue.get()
            try:
                body = self.cache.get(key)
                if body is not None and not (body.get("metadata") or {}).get("deletionTimestamp"):
                    requeue = await self.reconcile(key, body)
                    self.failures.pop(key, None)
                    if requeue is not None:
                        self.queue.add_after(key, requeue + 0.5)
            except Exception as e:  # keep the worker alive; retry the key with backoff
                n = self.failures[key] = self.failures.get(key, 0) + 1
                delay = min(self.options.max_backoff_seconds, 0.5 * 2**n) * (
                    1 + random.random() / 4
                )
                log.warning("Reconcile of %s/%s failed (%s); retrying in %.1fs", *key, e, delay)
                self.metrics.reconcile_errors.labels(*key).inc()
                self.queue.add_after(key, delay)
            finally:
                self.queue.done(key)

    def observed(self, body: Mapping[str, Any], namespace: str, name: str) -> Observed:
        """The PDDeployment and its children as the caches hold them: no API request."""
        children = self.store.children(namespace, name)
        # Every watched kind reaches the core: the two it reads apart, the rest as `others`.
        others = [
            o for k in WATCHED if k not in (DEPLOYMENT, POD) for o in children.get(k.kind, [])
        ]
        return Observed(body, children.get(DEPLOYMENT.kind, []), children.get(POD.kind, []), others)

    async def reconcile(self, key: Key, body: Mapping[str, Any]) -> float | None:
        """Steps: 1 read the cached children, 2 decide (pure), 3 apply every action (keep going
        past a refusal), 4 report: write status once if it changed, 5 post the events of what
        was accepted. Returns when to look again; raises when a write was refused (backoff)."""
        namespace, name = key
        started = time.monotonic()
        decision = decide(self.observed(body, namespace, name), time.time())
        refused = await asyncio.to_thread(self._apply, namespace, decision.actions)
        report = decision.report(refused)
        if report.status_changed:
            old = body.get("status") or {}
            await asyncio.to_thread(self.kube.patch_status, namespace, name, report.status, old)
            cached = self.cache.get(key)
            if cached is not None:
                cached["status"] = report.status  # until the watch brings the server's copy
        for event in report.events:
            # Posted by one task in order, after the status write: events are best effort and
            # need not hold this key's worker.
            self.events.put_nowait((body, event))
        self.metrics.observe(namespace, name, decision, report, refused, time.monotonic() - started)
        if refused:
            raise WritesRefused("; ".join(f"{r.key}: {r.message}" for r in refused))
        return decision.requeue_after

    def _apply(self, namespace: str, actions: tuple[Action, ...]) -> list[Rejection]:
        refused = []
        for action in actions:
            try:
                if isinstance(action, Apply):
                    self.store.put(action.kind, self.kube.apply(action.manifest))
                    verb = "Updated" if action.exists else "Created"
                    log.info("%s %s", verb, action.key, extra={"namespace": namespace})
                elif isinstance(action, Scale):
                    scaled = self.kube.scale(namespace, action.name, action.replicas)
                    if scaled is not None:
                        self.store.put(DEPLOYMENT.kind, scaled)
                    log.info("Scaled %s to %d", action.key, action.replicas)
                elif isinstance(action, Delete):
                    self.kube.delete(action.kind, namespace, action.name)
                    self.store.drop(action.kind, namespace, action.name)
                    log.info("Deleted %s", action.key)
                elif isinstance(action, Annotate):
                    body = {"metadata": {"annotations": dict(action.annotations)}}
                    patched = self.kube.patch(
                        POD.kind, namespace, action.name, body, "application/merge-patch+json"
                    )
                    self.store.put(POD.kind, patched)
                    log.info("Marked %s: %s", action.key, body["metadata"]["annotations"])
            except ApiError as e:
                log.warning("The API server refused %s: %s", action.key, e.message)
                refused.append(Rejection(action.key, e.status, e.message))
        return refused

    async def _poster(self) -> None:
        while True:
            body, event = await self.events.get()
            await asyncio.to_thread(self._post, body, event)

    def _post(self, body: Mapping[str, Any], event: Event) -> None:
        try:
            self.kube.event(body, event.type, event.reason, event.message)
        except ApiError as e:  # events are best effort
            log.info("Could not post event %s: %s", event.reason, e)


def connection_info(cfg: Any) -> kopf.ConnectionInfo:
    """kopf credentials from a kubernetes-client Configuration."""
    token = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
    scheme = None
    if token:
        scheme, _, token = token.partition(" ") if " " in token else ("Bearer", "", token)
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
        scheme=scheme,
        token=token or None,
    )


def build_registry(
    controller: Controller, webhook: WebhookOptions | None = None
) -> kopf.OperatorRegistry:
    """kopf handlers of the operator, in a registry of their own (no module-level state)."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        # kopf talks to the API with the same identity as the reconciler (--kubeconfig or
        # in-cluster), not with whatever its own discovery would find.
        return connection_info(controller.kube.api.configuration)

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        prefix = v.ANNOTATION_KOPF_PREFIX
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=prefix)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=prefix)
        settings.posting.enabled = False  # our own events only, not every log line
        settings.peering.standalone = True
        settings.watching.server_timeout = 300
        settings.networking.request_timeout = 60
        if webhook is not None:
            settings.admission.server = server(webhook)
            if webhook.manage:
                settings.admission.managed = MANAGED_CONFIGURATION
        await controller.start()

    @kopf.on.cleanup(registry=registry)
    async def stop(**_: Any) -> None:
        await controller.stop()

    @kopf.on.event(v.GROUP, v.VERSION, v.PLURAL, registry=registry)
    def pdd_event(event: kopf.RawEvent, **_: Any) -> None:
        controller.on_pdd_event(event)

    if webhook is not None:
        from pdmtp import admission  # the webhook's dry runs; only when it is served

        # failurePolicy Ignore: an operator that is down must not block every apply; the CRD's
        # CEL rules and the operator's own check remain.
        @kopf.on.validate(
            v.GROUP,
            v.VERSION,
            v.PLURAL,
            id="agreement",
            ignore_failures=True,
            operations=["CREATE", "UPDATE"],
            registry=registry,
        )
        def admit(body: kopf.Body, namespace: str | None = None, **_: Any) -> None:
            # The offline verdict, then the rendered children dry-run on the API server: a spec
            # whose Deployments would be refused is refused here, in the server's words.
            ns = body.get("metadata", {}).get("namespace") or namespace or "default"
            try:
                problems = admission.review(controller.kube.api, body, ns)
            except Exception as e:  # the dry run itself failed (an API error, a timeout)
                log.warning("Dry run of the children failed, admitting on the offline check: %s", e)
                problems = list(validate(body).problems)
            if problems:
                raise kopf.AdmissionError("; ".join(p.line() for p in problems), code=422)

    return registry


def run(
    kube: Kube,
    options: Options,
    metrics: Metrics,
    liveness: str | None = None,
    webhook: WebhookOptions | None = None,
) -> None:
    """Run the operator until interrupted."""
    controller = Controller(kube, options, metrics)
    registry = build_registry(controller, webhook)
    kopf.configure(verbose=False, debug=log.isEnabledFor(logging.DEBUG))
    asyncio.run(
        kopf.operator(
            registry=registry,
            namespaces=list(options.namespaces),
            clusterwide=not options.namespaces,
            standalone=True,
            liveness_endpoint=liveness,
        )
    )

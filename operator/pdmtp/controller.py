"""The kopf shell: watch, queue, observe -> core.decide -> apply -> status. No decisions here.

kopf watches PDDeployments and the Deployments and pods pdmtp manages; every event only puts the
owning PDDeployment's key on a work queue. Workers take one key at a time (a key is never worked
on twice at once), list its children, call `pdmtp.core.reconcile.decide`, apply the actions,
write status once if it changed, and post events after that write. A periodic resync re-queues
every key, so pod churn is noticed even if an event is lost. Only raw watch events are used
(`kopf.on.event`): kopf keeps no bookkeeping on the objects, adds no finalizer, and a restart
rebuilds everything from the initial listing.
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
from pdmtp.core.actions import Apply, Delete, Event, Scale
from pdmtp.core.reconcile import Decision, Observed, decide
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
    max_backoff_seconds: float = 60.0


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
    failures: dict[Key, int] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

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

    def on_child_event(self, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        owner = (meta.get("labels") or {}).get(v.LABEL_NAME)
        key = (meta.get("namespace", ""), owner or "")
        if owner and key in self.cache:
            self.queue.add(key)

    # ---- work side ------------------------------------------------------------------------

    async def start(self) -> None:
        for i in range(self.options.workers):
            self.tasks.append(asyncio.create_task(self._worker(), name=f"pdmtp-worker-{i}"))
        self.tasks.append(asyncio.create_task(self._resync(), name="pdmtp-resync"))

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.options.resync_seconds)
            for key in list(self.cache):
                self.queue.add(key)

    async def _worker(self) -> None:
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

    async def reconcile(self, key: Key, body: Mapping[str, Any]) -> float | None:
        """Steps: 1 list children, 2 decide (pure), 3 apply every action (keep going past a
        failure), 4 write status once if it changed, 5 post events. Returns when to look again."""
        namespace, name = key
        started = time.monotonic()
        deployments, pods, others = await asyncio.to_thread(self.kube.children, namespace, name)
        decision = decide(Observed(body, deployments, pods, others), time.time())
        errors = await asyncio.to_thread(self._apply, namespace, decision)
        if decision.status_changed:
            old = body.get("status") or {}
            await asyncio.to_thread(self.kube.patch_status, namespace, name, decision.status, old)
            cached = self.cache.get(key)
            if cached is not None:
                cached["status"] = decision.status  # until the watch brings the server's copy
        for event in decision.events:
            await asyncio.to_thread(self._post, body, event)
        self.metrics.observe(namespace, name, decision, time.monotonic() - started)
        if errors:
            raise errors[0]
        return decision.requeue_after

    def _apply(self, namespace: str, decision: Decision) -> list[ApiError]:
        errors = []
        for action in decision.actions:
            try:
                if isinstance(action, Apply):
                    self.kube.apply(action.manifest)
                    log.info("Applied %s", action.key, extra={"namespace": namespace})
                elif isinstance(action, Scale):
                    self.kube.scale(namespace, action.name, action.replicas)
                    log.info("Scaled Deployment/%s to %d", action.name, action.replicas)
                elif isinstance(action, Delete):
                    self.kube.delete(action.kind, namespace, action.name)
                    log.info("Deleted %s/%s", action.kind, action.name)
            except ApiError as e:
                log.warning("Could not apply %s: %s", action, e)
                errors.append(e)
        return errors

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
    managed = {v.LABEL_MANAGED_BY: v.MANAGED_BY}

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

    @kopf.on.event("apps", "v1", "deployments", labels=managed, registry=registry)
    def deployment_event(body: kopf.Body, **_: Any) -> None:
        controller.on_child_event(body)

    @kopf.on.event("", "v1", "pods", labels=managed, registry=registry)
    def pod_event(body: kopf.Body, **_: Any) -> None:
        controller.on_child_event(body)

    if webhook is not None:
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
        def admit(body: kopf.Body, **_: Any) -> None:
            problems = validate(body).problems
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
    kopf.configure(verbose=False)
    asyncio.run(
        kopf.operator(
            registry=registry,
            namespaces=list(options.namespaces),
            clusterwide=not options.namespaces,
            standalone=True,
            liveness_endpoint=liveness,
        )
    )

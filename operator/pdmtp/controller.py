"""The controller's loops: queue, observe -> core.decide -> apply -> status. No decisions here.

Reflectors (`pdmtp.watches`) watch the PDDeployments, every child kind pdmtp manages and the Nodes
into in-memory stores. Every event only puts the owning PDDeployment's key on the work queue
(`pdmtp.workqueue`). Workers take one key at a time, read its children from the store (no API
request), call `pdmtp.core.reconcile.decide`, apply the actions (`pdmtp.executor`: stopping at the
first refusal), write the status once if it changed, with the refused writes in it, and post the
events of what was accepted after that write. Writes never enter the stores: each leaves an
expectation (`pdmtp.expectations`), and the key's next reconcile waits until the watch shows it.
A periodic resync re-queues every key. Nothing is kept on the objects (no finalizer, no
bookkeeping annotations), and a restart rebuilds everything from the initial listings.
`pdmtp.manager` runs it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pdmtp.api import vocabulary as v
from pdmtp.backoff import backoff
from pdmtp.core.actions import Event
from pdmtp.core.objects import Key, is_terminating, resource_version
from pdmtp.core.reconcile import decide
from pdmtp.election import Elector
from pdmtp.executor import Executor
from pdmtp.expectations import Expectations, after_write
from pdmtp.health import GRACE_SECONDS, Health, assess
from pdmtp.kube import ApiError, Kube
from pdmtp.metrics import Metrics
from pdmtp.probe import HttpTarget, Prober, ProbeTarget
from pdmtp.scrape import HttpSource, MetricsSource, Scraper
from pdmtp.watches import Watches, spans_nodes
from pdmtp.workqueue import WorkQueue

log = logging.getLogger("pdmtp")


@dataclass(frozen=True)
class Options:
    namespaces: tuple[str, ...] = ()
    """Empty: all namespaces."""
    resync_seconds: float = 30.0
    workers: int = 4
    max_backoff_seconds: float = 30.0
    sync_timeout_seconds: float = 120.0
    grace_seconds: float = GRACE_SECONDS
    """How long the PDDeployments may go unwatched before the operator reports itself not live."""
    verification_seconds: float = 15.0
    """How often a PDDeployment's engines are scraped for its verdict (`scrape.Scraper`)."""


STALE_REQUEUE_SECONDS = 0.0


class WritesRefused(Exception):
    """Some of a reconcile's writes were refused; the key is retried with backoff."""


@dataclass
class Controller:
    kube: Kube
    options: Options
    metrics: Metrics
    queue: WorkQueue = field(default_factory=WorkQueue)
    expectations: Expectations = field(default_factory=Expectations)
    """Each PDDeployment's accepted writes that the watches have not shown yet."""
    failures: dict[Key, int] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    events: asyncio.Queue[tuple[Mapping[str, Any], Event]] = field(default_factory=asyncio.Queue)
    started_at: float = field(default_factory=time.monotonic)
    webhook_resolved: Callable[[], bool] | None = None
    """Set when the webhook is on: whether kopf has resolved the resource it admits."""
    source: MetricsSource = field(default_factory=HttpSource)
    """Where the autoscaler reads the engines' metrics."""
    scraper: Scraper | None = None
    probes: ProbeTarget = field(default_factory=HttpTarget)
    """Where the operator's own requests go (`pdmtp.probe`)."""
    prober: Prober | None = None
    elector: Elector | None = None
    """Leader election (None: run without, always leading). A standby keeps its caches warm
    and reconciles nothing until it leads."""
    watches: Watches = field(init=False)
    """The reflectors and the caches they fill (`pdmtp.watches`)."""
    executor: Executor = field(init=False)
    """Applies a decision's actions (`pdmtp.executor`)."""

    def __post_init__(self) -> None:
        self.watches = Watches(self.kube, self.metrics, self.options.namespaces)
        self.executor = Executor(self.kube, self.expectations, self.metrics, self.watches.held)

    # ---- watch side -----------------------------------------------------------------------

    def on_pdd_change(self, key: Key) -> None:
        if self.watches.pdds.get(key) is None:  # deleted, or gone from a fresh listing
            self.failures.pop(key, None)
            self.expectations.forget(key)
            self.metrics.forget(*key)
            return
        self.queue.add(key)

    def on_child_change(self, key: Key) -> None:
        if self.watches.pdds.get(key) is not None:
            self.queue.add(key)

    def on_node_change(self) -> None:
        """A cordon set or lifted: every PDDeployment looks again (its pods may sit there)."""
        if self.watches.update_cordons():
            for key in self.watches.pdds.snapshot():
                self.queue.add(key)

    # ---- work side ------------------------------------------------------------------------

    async def start(self) -> None:
        await self.watches.start(self.on_pdd_change, self.on_child_change, self.on_node_change)
        self.tasks.append(asyncio.create_task(self.watches.await_sync(), name="pdmtp-sync"))
        for i in range(self.options.workers):
            self.tasks.append(asyncio.create_task(self._worker(), name=f"pdmtp-worker-{i}"))
        self.tasks.append(asyncio.create_task(self._resync(), name="pdmtp-resync"))
        self.tasks.append(asyncio.create_task(self._poster(), name="pdmtp-events"))
        pdds, store = self.watches.pdds, self.watches.store
        self.scraper = Scraper(
            self.source,
            pdds,
            store,
            self.queue.add,
            verify_seconds=self.options.verification_seconds,
        )
        self.tasks.append(asyncio.create_task(self._scrape(), name="pdmtp-scraper"))
        self.prober = Prober(self.probes, pdds, store, self.metrics)
        self.tasks.append(asyncio.create_task(self._probe(), name="pdmtp-prober"))

    def leads(self) -> bool:
        """Whether this process leads now (always, without election)."""
        return self.elector is None or self.elector.leads

    async def _leading(self) -> None:
        """Return once this process leads (at once without election)."""
        if self.elector is not None:
            await self.elector.leading.wait()

    async def _scrape(self) -> None:
        assert self.scraper is not None
        await self.watches.synced.wait()
        await self._leading()  # a standby sends no request to the engines
        await self.scraper.run()

    async def _probe(self) -> None:
        assert self.prober is not None
        await self.watches.synced.wait()
        await self._leading()  # a standby sends no request either
        await self.prober.run()

    def health(self) -> Health:
        now = time.monotonic()
        workers = [t for t in self.tasks if t.get_name().startswith("pdmtp-worker")]
        return assess(
            self.watches.pdd_watches(now),
            children_synced=self.watches.synced.is_set(),
            workers_alive=not any(t.done() for t in workers),  # none yet: starting
            # A standby serves no webhook yet (kopf's start waits for the Lease).
            webhook_resolved=(
                None
                if self.webhook_resolved is None or not self.leads()
                else self.webhook_resolved()
            ),
            uptime=now - self.started_at,
            grace=self.options.grace_seconds,
            leader=None if self.elector is None else self.elector.status(),
        )

    async def stop(self) -> None:
        self.watches.stop()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.options.resync_seconds)
            watches = self.watches
            self.metrics.cached_objects.set(watches.store.size())
            keys = watches.pdds.snapshot()
            if watches.workload_api is None and any(spans_nodes(watches.pdds.get(k)) for k in keys):
                await asyncio.to_thread(watches.discover_workload_api)
            for key in keys:
                self.queue.add(key)

    async def _worker(self) -> None:
        await self.watches.synced.wait()
        await self._leading()
        while True:
            key = await self.queue.get()
            try:
                if (wait := self.expectations.wait(key, self.watches.held)) is not None:
                    # The watch event that shows the write queues the key again.
                    self.queue.add_after(key, wait)
                    continue
                body = self.watches.pdds.get(key)
                if body is not None and not is_terminating(body):
                    requeue = await self.reconcile(key, body)
                    self.failures.pop(key, None)
                    if requeue is not None:
                        self.queue.add_after(key, requeue + 0.5)
            except Exception as e:  # keep the worker alive; retry the key with backoff
                n = self.failures[key] = self.failures.get(key, 0) + 1
                delay = backoff(n, 0.5, self.options.max_backoff_seconds)
                log.warning("Reconcile of %s/%s failed (%s); retrying in %.1fs", *key, e, delay)
                self.metrics.reconcile_errors.labels(*key).inc()
                self.queue.add_after(key, delay)
            finally:
                self.queue.done(key)

    async def reconcile(self, key: Key, body: Mapping[str, Any]) -> float | None:
        """Steps: 1 read the cached children, 2 decide (pure), 3 apply the actions (stop at
        the first refusal), 4 report: write status once if it changed, 5 post the events of what
        was accepted. Returns when to look again; raises when a write was refused (backoff)."""
        namespace, name = key
        started = time.monotonic()
        metrics = self.scraper.metrics(namespace, name) if self.scraper is not None else {}
        decision = decide(self.watches.observed(body, key, metrics), time.time())
        applied = await asyncio.to_thread(self.executor.apply, key, decision.actions)
        refused = applied.refused
        report = decision.report(refused, applied.unapplied)
        stale_status = False
        if report.status_changed:
            old = body.get("status") or {}
            # Over the version observed: a status decided on a stale view (or one a newer
            # leader has written over) is refused rather than laid on top.
            version = resource_version(body)
            try:
                written = await asyncio.to_thread(
                    self.kube.patch_status, namespace, name, report.written, old, v.KIND, version
                )
            except ApiError as e:
                if e.status != 409 or version is None:
                    raise
                log.info("%s/%s changed since it was observed; status re-planned", *key)
                self.metrics.stale_writes.inc()
                written, stale_status = None, True
            self.expectations.expect(
                key, after_write(v.KIND, name, version, resource_version(written))
            )
        for event in report.events:
            # Posted by one task in order, after the status write: events are best effort and
            # need not hold this key's worker.
            self.events.put_nowait((body, event))
        self.metrics.observe(
            namespace, name, decision, report, applied.unapplied, time.monotonic() - started
        )
        if refused:
            self.metrics.refused.labels(namespace, name).inc(len(refused))
            raise WritesRefused("; ".join(f"{r.key}: {r.message}" for r in refused))
        if applied.stale or stale_status:  # the watch is about to bring what changed
            return STALE_REQUEUE_SECONDS
        return decision.requeue_after

    async def _poster(self) -> None:
        while True:
            body, event = await self.events.get()
            await asyncio.to_thread(self._post, body, event)

    def _post(self, body: Mapping[str, Any], event: Event) -> None:
        try:
            self.kube.event(body, event.type, event.reason, event.message)
        except ApiError as e:  # events are best effort
            log.info("Could not post event %s: %s", event.reason, e)

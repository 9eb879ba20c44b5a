"""The autoscaler's and the verdict's eyes: scrape each PDDeployment's engine pods once per
interval.

A `Scraper` task wakes every second, and for each PDDeployment with spec.autoscaling (at its
interval) or a spec.verification.mode other than Off (every `verify_seconds`) whose interval has
passed reads each live engine pod's metrics through a `MetricsSource`, keeps the two latest
scrapes per pod (windowed signals need both) and the windows between all its scrapes (the
verdict's evidence, bounded: `core.windows.record`), forgets pods that are gone, and queues the
PDDeployment so its reconcile decides on the fresh numbers (an autoscaled one every round, its
windows move with the clock; another only when a pod's numbers changed). It decides nothing
itself.

Two sources:

- `HttpSource` (in a cluster): `GET http://<pod IP>:<metrics port>/metrics`, the engines'
  metrics-only listener, which their NetworkPolicy opens to pods labelled
  `pdmtp.io/metrics-scraper: "true"` (the operator's own pod is);
- `DirectorySource` (the KWOK cluster tier, whose pod IPs are fake and must never be dialled):
  `<dir>/<namespace>/<pod>.prom`, Prometheus text that the test writes; the file's modification
  time is the scrape's time, so a file the test stops writing goes stale like a silent pod.
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from pdmtp.api import vocabulary as v
from pdmtp.api.autoscaling import AutoscalingSpec
from pdmtp.api.kinds import POD
from pdmtp.cache import ChildStore, Table
from pdmtp.core.objects import Key, Obj, is_terminating, labels_of, metadata_of, name_of, pod_url
from pdmtp.core.promtext import Scrape, parse_scrape
from pdmtp.core.windows import PodMetrics

log = logging.getLogger("pdmtp.scrape")


TIMEOUT_SECONDS = 2.0
"""One scrape's bound: a pod that does not answer in time counts as silent this round."""
CONCURRENCY = 8
TICK_SECONDS = 1.0


class MetricsSource(Protocol):
    def read(self, pod: Obj) -> Scrape | None:
        """The pod's metrics now, or None when it has none to give (not up, no answer)."""


@dataclass(frozen=True)
class HttpSource:
    port: int = v.ENGINE_METRICS_PORT

    def read(self, pod: Obj) -> Scrape | None:
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            return None
        try:
            with urllib.request.urlopen(
                f"{pod_url(ip, self.port)}/metrics", timeout=TIMEOUT_SECONDS
            ) as answer:
                text = answer.read().decode("utf-8", "replace")
        except (OSError, urllib.error.URLError) as e:
            log.debug("No metrics from %s: %s", name_of(pod), e)
            return None
        return parse_scrape(text, time.time())


@dataclass(frozen=True)
class DirectorySource:
    """Scrapes from files, `ROOT/<namespace>/<pod>.prom` (tests): a writer replaces a file
    whole (write elsewhere, then rename), since a file read while rewritten in place can be
    empty, and an empty scrape reads as an engine without the hand-off counts."""

    root: Path

    def path_of(self, namespace: str, pod_name: str) -> Path:
        """Where the pod's metrics are read from (and where a test writes them)."""
        return self.root / namespace / f"{pod_name}.prom"

    def read(self, pod: Obj) -> Scrape | None:
        path = self.path_of(metadata_of(pod).get("namespace", ""), name_of(pod))
        try:
            at = path.stat().st_mtime
            text = path.read_text()
        except OSError:
            return None
        return parse_scrape(text, at)


def source_from(spec: str | None) -> MetricsSource:
    """`--metrics-source`: unset or `http` dials the pods; `dir:PATH` reads files (tests)."""
    if spec is None or spec == "http":
        return HttpSource()
    if spec.startswith("dir:"):
        return DirectorySource(Path(spec[len("dir:") :]))
    raise ValueError(f"--metrics-source must be http or dir:PATH, not {spec!r}")


@dataclass
class Scraper:
    source: MetricsSource
    pdds: Table
    store: ChildStore
    on_scraped: Callable[[Key], None]
    """Called on the event loop after a PDDeployment's round (queue its reconcile)."""
    verify_seconds: float = 15.0
    """The interval for a PDDeployment scraped only for its verdict (`--verification-interval`)."""
    seen: dict[Key, dict[str, PodMetrics]] = field(default_factory=dict)
    due: dict[Key, float] = field(default_factory=dict)
    rounds: int = 0

    def metrics(self, namespace: str, name: str) -> dict[str, PodMetrics]:
        return dict(self.seen.get((namespace, name), {}))

    async def run(self) -> None:
        limit = asyncio.Semaphore(CONCURRENCY)  # scrapes in flight, across PDDeployments
        while True:
            now = time.monotonic()
            due = []
            for key in self.pdds.snapshot():
                interval = _interval(self.pdds.get(key), self.verify_seconds)
                if interval is None:
                    self.seen.pop(key, None)
                    self.due.pop(key, None)
                elif now >= self.due.get(key, 0.0):
                    self.due[key] = now + interval
                    due.append(key)
            # One slow PDDeployment (pods that time out) does not delay the others' rounds.
            changed = await asyncio.gather(*(self._round(key, limit) for key in due))
            for key, moved in zip(due, changed, strict=True):
                if moved or _autoscaled(self.pdds.get(key)):
                    self.on_scraped(key)
            for gone in set(self.seen) - set(self.pdds.snapshot()):
                self.seen.pop(gone, None)
                self.due.pop(gone, None)
            await asyncio.sleep(TICK_SECONDS)

    async def _round(self, key: Key, limit: asyncio.Semaphore) -> bool:
        """Scrape the PDDeployment's pods; whether anything differs from the last round."""
        namespace, name = key
        pods = [
            p
            for p in self.store.children(namespace, name).get(POD.kind, [])
            if labels_of(p).get(v.LABEL_ROLE) in v.ENGINE_ROLES
            and not is_terminating(p)
            # A multi-node group serves (and reports) through its leader; its other ranks run
            # headless, with no HTTP server to scrape.
            and labels_of(p).get(v.LABEL_GROUP_RANK, "0") == "0"
        ]

        async def one(pod: Obj) -> tuple[str, Scrape | None]:
            async with limit:
                return name_of(pod), await asyncio.to_thread(self.source.read, pod)

        results = await asyncio.gather(*(one(p) for p in pods))
        before = self.seen.get(key, {})
        now: dict[str, PodMetrics] = {}
        for pod, scrape in results:
            was = before.get(pod, PodMetrics())
            # Silent this round: its last scrape ages into staleness.
            now[pod] = was if scrape is None else was.scraped(scrape)
        self.seen[key] = now
        self.rounds += 1
        return now != before


def _autoscaled(body: Obj | None) -> bool:
    return body is not None and isinstance((body.get("spec") or {}).get("autoscaling"), Mapping)


def _interval(body: Obj | None, verify_seconds: float) -> float | None:
    if body is None or is_terminating(body):
        return None
    spec = body.get("spec") or {}
    auto = spec.get("autoscaling")
    if not isinstance(auto, Mapping):
        verification = spec.get("verification")
        mode = verification.get("mode") if isinstance(verification, Mapping) else None
        return None if mode == "Off" else verify_seconds
    default = float(AutoscalingSpec.model_fields["interval_seconds"].default)
    seconds = auto.get("intervalSeconds", default)
    return float(seconds) if isinstance(seconds, int | float) and seconds > 0 else default

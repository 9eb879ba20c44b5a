"""The operator's own requests through a revision's router, so that a revision without traffic
can be judged (`core.verification.probing` decides which, and how often).

A `Prober` task wakes every second, asks the core which probes are due for each PDDeployment
(from its status: the verdicts waiting for requests or drafts; from the store: its Ready pods),
and sends each through a `ProbeTarget`, one at a time per revision, counting the results
(`pdmtp_verification_probes_total`). The verdict itself moves as ever: the scraper reads what
the probes made the decodes count.

Two targets, chosen as the metrics source is (`--probe-target`, default: the same kind):

- `HttpTarget` (in a cluster): `POST http://<router pod IP>:8000/v1/completions`; routers take
  any client, and the operator's pod is one;
- `DirectoryTarget` (the KWOK cluster tier, whose pod IPs are fake and must never be dialled):
  appends the probe as a JSON line to `<dir>/<namespace>/<name>.probes`, for the test to read.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pdmtp.api.kinds import POD
from pdmtp.api.v1alpha1 import PDDeploymentSpec
from pdmtp.cache import ChildStore, Table
from pdmtp.core.objects import Key, is_terminating
from pdmtp.core.verification.probing import Probe, due
from pdmtp.metrics import Metrics

log = logging.getLogger("pdmtp.probe")


TIMEOUT_SECONDS = 30.0
"""One probe's bound: a completion of 16 tokens on a loaded engine, with its prefill."""
TICK_SECONDS = 1.0


class ProbeTarget(Protocol):
    def send(self, namespace: str, name: str, probe: Probe) -> str:
        """Send the probe; its result: ok, failed or recorded."""


@dataclass(frozen=True)
class HttpTarget:
    def send(self, namespace: str, name: str, probe: Probe) -> str:
        request = urllib.request.Request(
            probe.url,
            data=json.dumps(probe.body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as answer:
                answer.read()
        except (OSError, urllib.error.URLError) as e:
            log.info("Probe of %s/%s revision %s failed: %s", namespace, name, probe.revision, e)
            return "failed"
        return "ok"


@dataclass(frozen=True)
class DirectoryTarget:
    root: Path

    def send(self, namespace: str, name: str, probe: Probe) -> str:
        line = {"revision": probe.revision, "router": probe.router, "url": probe.url,
                "body": dict(probe.body), "at": time.time()}  # fmt: skip
        (self.root / namespace).mkdir(parents=True, exist_ok=True)
        with (self.root / namespace / f"{name}.probes").open("a") as f:
            f.write(json.dumps(line) + "\n")
        return "recorded"


def target_from(spec: str | None) -> ProbeTarget:
    """`--probe-target` (or, unset, `--metrics-source`): http dials the routers, dir:PATH
    records to files (tests whose pod IPs are fake)."""
    if spec is None or spec == "http":
        return HttpTarget()
    if spec.startswith("dir:"):
        return DirectoryTarget(Path(spec[len("dir:") :]))
    raise ValueError(f"--probe-target must be http or dir:PATH, not {spec!r}")


@dataclass
class Prober:
    target: ProbeTarget
    pdds: Table
    store: ChildStore
    metrics: Metrics | None = None
    last: dict[Key, dict[str, float]] = field(default_factory=dict)
    """Per PDDeployment, when each revision was last probed (monotonic)."""
    in_flight: dict[Key, set[str]] = field(default_factory=dict)
    """Per PDDeployment, the revisions with a probe on its way."""
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def due_now(self, key: Key, now: float) -> list[Probe]:
        body = self.pdds.get(key)
        if body is None or is_terminating(body):
            return []
        try:
            spec = PDDeploymentSpec.model_validate(body.get("spec") or {})
        except ValueError:
            return []  # the reconcile reports it
        namespace, name = key
        pods = self.store.children(namespace, name).get(POD.kind, [])
        status: Mapping[str, Any] = body.get("status") or {}
        last = self.last.get(key, {})
        probes = due(spec.effective_verification, spec.model.name, status, pods, last, now)
        return [p for p in probes if p.revision not in self.in_flight.get(key, set())]

    async def run(self) -> None:
        while True:
            now = time.monotonic()
            for key in self.pdds.snapshot():
                for probe in self.due_now(key, now):
                    self.last.setdefault(key, {})[probe.revision] = now
                    self.in_flight.setdefault(key, set()).add(probe.revision)
                    task = asyncio.create_task(self._send(key, probe), name="pdmtp-probe")
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
            for gone in set(self.last) - set(self.pdds.snapshot()):
                self.last.pop(gone, None)
                self.in_flight.pop(gone, None)
            await asyncio.sleep(TICK_SECONDS)

    async def _send(self, key: Key, probe: Probe) -> None:
        namespace, name = key
        try:
            result = await asyncio.to_thread(self.target.send, namespace, name, probe)
        except OSError as e:
            log.warning("Probe of %s/%s could not be sent: %s", namespace, name, e)
            result = "failed"
        finally:
            self.in_flight.get(key, set()).discard(probe.revision)
        if self.metrics is not None:
            self.metrics.probes.labels(namespace, name, result).inc()

"""The shell of leader election: read and write the Lease on a timer, open and close the fence.

The decisions are `pdmtp.core.leadership`'s. The fence is what makes a lost lease harmless: every
write the operator sends goes through `Kube`, which asks the fence first, and the fence is open
only until the renew deadline after the start of the last successful renewal (monotonic time, so
a process paused by SIGSTOP or a frozen VM finds it closed when it wakes). A leader that loses its
Lease stops: the process exits and Kubernetes starts it again as a standby, as controller-runtime
does, so no state survives from the reign it lost.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pdmtp.core.leadership import Follow, Sighting, Timing, next_move, record_of, release, sight
from pdmtp.kube import ApiError, Kube

log = logging.getLogger("pdmtp.election")

IN_CLUSTER_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class NotLeading(Exception):
    """A write refused by the fence: this process does not (or no longer) hold the Lease."""


class Fence:
    """Open while this process may write: until a monotonic deadline the elector moves."""

    def __init__(self, on_refused: Callable[[], None] | None = None) -> None:
        self._until = -math.inf
        self.on_refused = on_refused

    @property
    def open(self) -> bool:
        return time.monotonic() < self._until

    def hold_until(self, deadline: float) -> None:
        self._until = deadline

    def close(self) -> None:
        self._until = -math.inf

    def check(self, what: str) -> None:
        """Raise NotLeading unless the fence is open; called right before every write."""
        if not self.open:
            if self.on_refused is not None:
                self.on_refused()
            raise NotLeading(f"{what} not sent: this operator does not hold the leader Lease")


def default_identity() -> str:
    """The pod's name (or the host's) and a random suffix: a restarted process is a new
    candidate, never mistaken for the holder it replaced."""
    base = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{base}_{uuid.uuid4().hex[:8]}"


def default_namespace() -> str | None:
    """The operator's own namespace: $POD_NAMESPACE, else the in-cluster service account's."""
    if ns := os.environ.get("POD_NAMESPACE"):
        return ns
    try:
        with open(IN_CLUSTER_NAMESPACE) as f:
            return f.read().strip() or None
    except OSError:
        return None


@dataclass(frozen=True)
class ElectionOptions:
    namespace: str
    name: str = "pdmtp-operator"
    identity: str = field(default_factory=default_identity)
    timing: Timing = field(default_factory=Timing)


@dataclass
class Elector:
    kube: Kube
    options: ElectionOptions
    fence: Fence
    on_change: Callable[[bool], None] = lambda leading: None
    """Told True when this process starts leading, False when it stops (then it must exit)."""
    leading: asyncio.Event = field(default_factory=asyncio.Event)
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    holder: str = ""
    """Who holds the Lease as last read ("" before the first read)."""
    last_error: str = ""
    sighting: Sighting | None = None
    released: bool = False
    """Handed back on a clean stop: the loop ends without calling it a loss."""

    @property
    def identity(self) -> str:
        return self.options.identity

    @property
    def leads(self) -> bool:
        """Holds the Lease and may write now (its fence is open)."""
        return self.leading.is_set() and self.fence.open

    async def run(self) -> None:
        """Look at the Lease every retry period until the Lease is lost (then return)."""
        timing = self.options.timing
        while True:
            started = time.monotonic()
            if self.released:
                return
            await self._step(started)
            if self.released:
                return
            if self.leading.is_set() and not self.fence.open:
                self._lose("its last renewal is older than the renew deadline")
                return
            if self.lost.is_set():
                return
            await asyncio.sleep(max(0.0, timing.retry_seconds - (time.monotonic() - started)))

    async def _step(self, started: float) -> None:
        o = self.options
        try:
            lease = await asyncio.to_thread(self.kube.read_lease, o.namespace, o.name)
            if lease is not None:
                record = record_of(lease, o.timing.lease_seconds)
                self.sighting = sight(self.sighting, record, time.monotonic())
                self.holder = record.holder
            else:
                self.sighting = None
                self.holder = ""
            if self.leading.is_set() and self.holder != self.identity:
                self._lose(f"the Lease names {self.holder or 'nobody'}")
                return
            move = next_move(
                self.sighting,
                self.identity,
                o.namespace,
                o.name,
                o.timing,
                time.monotonic(),
                datetime.now(UTC),
            )
            if isinstance(move, Follow):
                self.last_error = ""
                return
            written = await asyncio.to_thread(self.kube.write_lease, move.body, move.create)
            self._won(written, started)
        except ApiError as e:
            # 409: another candidate wrote first (or renewed): look again next period.
            self.last_error = f"{e.status} {e.message}"
            level = logging.DEBUG if e.status == 409 else logging.WARNING
            log.log(level, "Lease %s/%s: %s", o.namespace, o.name, self.last_error)
        except Exception as e:  # a network error: the fence closes on its own if it lasts
            self.last_error = str(e)
            log.warning("Lease %s/%s: %s", o.namespace, o.name, e)

    def _won(self, written: dict[str, object], started: float) -> None:
        o = self.options
        self.fence.hold_until(started + o.timing.renew_deadline_seconds)
        record = record_of(written, o.timing.lease_seconds)
        self.sighting = sight(None, record, time.monotonic())
        self.holder = record.holder
        self.last_error = ""
        if not self.leading.is_set():
            log.info(
                "Leading: %s holds Lease %s/%s (transition %d)",
                self.identity,
                o.namespace,
                o.name,
                record.transitions,
            )
            self.leading.set()
            self.on_change(True)

    def _lose(self, why: str) -> None:
        self.fence.close()
        log.error("Lost the leader Lease (%s): writing nothing more, exiting", why)
        self.lost.set()
        self.on_change(False)

    def release(self) -> None:
        """Hand the Lease back on a clean stop (best effort; blocking)."""
        o = self.options
        if not self.leading.is_set() or self.sighting is None or not self.fence.open:
            return
        move = release(self.sighting.record, self.identity, o.namespace, o.name, datetime.now(UTC))
        self.released = True
        self.fence.close()
        if move is None:
            return
        try:
            self.kube.write_lease(move.body, move.create)
            log.info("Released Lease %s/%s", o.namespace, o.name)
        except ApiError as e:
            log.warning("Could not release Lease %s/%s: %s", o.namespace, o.name, e.message)

    def status(self) -> dict[str, object]:
        """For /readyz: who this is, whether it leads, who the Lease names."""
        return {
            "identity": self.identity,
            "leading": self.leads,
            "holder": self.holder,
            "lease": f"{self.options.namespace}/{self.options.name}",
            **({"error": self.last_error} if self.last_error else {}),
        }


def unelected() -> Fence:
    """The fence of an operator run without election: always open."""
    fence = Fence()
    fence.hold_until(math.inf)
    return fence

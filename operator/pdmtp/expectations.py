"""What the operator wrote and the watch has not shown yet: read-your-writes without writing into
the watch-fed store, in the manner of the expectations of Kubernetes' own controllers.

The store (`pdmtp.cache`) holds only what listings and watches delivered, in the order the API
server sent it. A write's answer never enters it. Instead, each accepted write leaves an
`Expectation` on its PDDeployment: the store must stop holding the version it held before the
write (or, for a create, hold the object at all). Until every expectation of a key is met, its
next reconcile waits; the watch event that meets one queues the key again. resourceVersions are
compared for equality only, as the API contract allows (they are opaque).

An expectation that the watch does not meet within `TTL_SECONDS` (a watch down, a listing that
raced the write) is dropped, and the reconcile goes ahead on the store as it is: level-triggered,
it converges from there, as it would after a restart.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pdmtp.core.objects import Key

log = logging.getLogger(__name__)

TTL_SECONDS = 30.0

Held = Callable[[str, str, str], str | None]
"""(kind, namespace, name) -> the resourceVersion the store holds, None when it holds none."""


@dataclass(frozen=True)
class Expectation:
    """One accepted write of `kind`/`name` in its PDDeployment's namespace: met once the store
    holds another version than `before`. After an update that is the new one (or none: the
    object went meanwhile); after a create, any; after a delete, none, or the version of a pod
    in its grace period, which is still there with a deletionTimestamp."""

    kind: str
    name: str
    before: str | None
    """The resourceVersion the store held when the write was sent (None: it held none)."""

    def met(self, held: str | None) -> bool:
        return held != self.before


def after_write(
    kind: str, name: str, before: str | None, answer: str | None, *, created: bool = False
) -> Expectation | None:
    """What to wait for after a write that the server answered with version `answer`: nothing
    when it changed nothing (the same version), when the object is gone (no answer), or when it
    updated an object the store no longer holds (the watch already reported its deletion)."""
    if answer is None or answer == before or (before is None and not created):
        return None
    return Expectation(kind, name, before)


def after_delete(kind: str, name: str, before: str | None) -> Expectation | None:
    """What to wait for after a delete: nothing when the store held no such object."""
    return None if before is None else Expectation(kind, name, before)


class Expectations:
    """Per PDDeployment, its writes the store does not show yet, with when each was made.
    Thread-safe: the executor records from worker threads, the workers check on the loop."""

    def __init__(
        self, ttl: float = TTL_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl = ttl
        self.clock = clock
        self._lock = threading.Lock()
        self._pending: dict[Key, dict[tuple[str, str], tuple[Expectation, float]]] = {}

    def expect(self, owner: Key, expectation: Expectation | None) -> None:
        if expectation is None:
            return
        with self._lock:
            entries = self._pending.setdefault(owner, {})
            entries[(expectation.kind, expectation.name)] = (expectation, self.clock())

    def wait(self, owner: Key, held: Held) -> float | None:
        """None when the store shows every write of `owner` (the met and the expired ones are
        forgotten); otherwise how long until the oldest one left expires."""
        now = self.clock()
        with self._lock:
            entries = self._pending.get(owner, {})
            for slot, (expectation, since) in list(entries.items()):
                if expectation.met(held(expectation.kind, owner[0], expectation.name)):
                    del entries[slot]
                elif now - since >= self.ttl:
                    log.info(
                        "The watch did not show the write of %s %s/%s within %.0fs; "
                        "reconciling from the store as it is",
                        expectation.kind,
                        owner[0],
                        expectation.name,
                        self.ttl,
                    )
                    del entries[slot]
            if not entries:
                self._pending.pop(owner, None)
                return None
            return max(0.0, min(since for _, since in entries.values()) + self.ttl - now)

    def forget(self, owner: Key) -> None:
        with self._lock:
            self._pending.pop(owner, None)

    def pending(self, owner: Key) -> int:
        with self._lock:
            return len(self._pending.get(owner, {}))

"""The queue between the watches and the controller's workers, in the manner of client-go's
workqueue (asyncio; nothing of Kubernetes)."""

from __future__ import annotations

import asyncio

from pdmtp.core.objects import Key


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

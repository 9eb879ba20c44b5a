"""The operator's view of the PDDeployments and every child it manages, fed by watches:
reconciles read it, not the API.

One reflector per watched kind of `pdmtp.api.kinds` (and per namespace when the operator is
namespaced) lists the objects labelled `app.kubernetes.io/managed-by=pdmtp`, replaces its slice of
the store with the result, and watches from the list's resourceVersion. Any reconnect, for
whatever reason, lists again and replaces the slice, so an object deleted while no watch was open
never lingers. Every change reports the owning PDDeployment's key so its reconcile is queued.
The PDDeployments themselves come the same way (every one, into a `Table`): a reflector retries
until the API server serves them, so a CRD created after the operator, or an API server that
comes back without its custom resources for a while, delays the operator instead of ending it.

Nothing else enters the store: the API server's answers to the operator's own writes do not, so
the store never mixes two streams and never has to order them (resourceVersions are opaque). A
reconcile that follows a write waits for the watch to show it (`pdmtp.expectations`). Each store
offers `held`, the resourceVersion it holds for a name, which is what those expectations compare.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

from pdmtp.api import vocabulary as v
from pdmtp.api.kinds import Kind
from pdmtp.backoff import backoff
from pdmtp.core.objects import Key, Manifest, resource_version
from pdmtp.kube import ApiError, send

log = logging.getLogger(__name__)

SELECTOR = f"{v.LABEL_MANAGED_BY}={v.MANAGED_BY}"
WATCH_SECONDS = (240, 360)
"""Server-side watch timeout, randomised so reflectors do not re-list in step."""
MAX_BACKOFF_SECONDS = 8.0
"""The longest pause between failed listings: an API server or a CRD that comes back is seen
within this (and the jitter) of its return."""


def _owner(obj: Mapping[str, Any]) -> Key | None:
    meta = obj.get("metadata") or {}
    owner = (meta.get("labels") or {}).get(v.LABEL_NAME)
    return (meta.get("namespace", ""), owner) if owner else None


def _slim(obj: Manifest, kind: str) -> Manifest:
    obj["kind"] = kind
    # managedFields are the bulk of an object and nothing here reads them.
    (obj.get("metadata") or {}).pop("managedFields", None)
    return obj


class Table:
    """Objects of one kind by (namespace, name), each its own owner: the PDDeployments.
    Thread-safe, with the same `put`/`drop`/`replace` as `ChildStore` so a reflector feeds
    either."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[Key, Manifest] = {}

    def put(self, kind: str, obj: Manifest) -> Key | None:
        meta = obj.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        with self._lock:
            self._objects[key] = _slim(obj, kind)
        return key

    def drop(self, kind: str, namespace: str, name: str) -> Key | None:
        with self._lock:
            self._objects.pop((namespace, name), None)
        return (namespace, name)

    def replace(self, kind: str, namespace: str | None, objs: Iterable[Manifest]) -> set[Key]:
        fresh = {}
        for obj in objs:
            meta = obj.get("metadata") or {}
            fresh[(meta.get("namespace", ""), meta.get("name", ""))] = _slim(obj, kind)
        with self._lock:
            gone = {k for k in self._objects if namespace is None or k[0] == namespace} - set(fresh)
            for key in gone:
                del self._objects[key]
            changed = gone | {k for k, o in fresh.items() if self._objects.get(k) != o}
            self._objects.update(fresh)
        return changed

    def get(self, key: Key) -> Manifest | None:
        with self._lock:
            return self._objects.get(key)

    def snapshot(self) -> list[Key]:
        with self._lock:
            return list(self._objects)

    def held(self, namespace: str, name: str) -> str | None:
        with self._lock:
            return resource_version(self._objects.get((namespace, name)))


class Sink(Protocol):
    def put(self, kind: str, obj: Manifest) -> Key | None: ...
    def drop(self, kind: str, namespace: str, name: str) -> Key | None: ...
    def replace(self, kind: str, namespace: str | None, objs: Iterable[Manifest]) -> set[Key]: ...


class ChildStore:
    """Children by kind and by owning PDDeployment. Thread-safe: reflectors write from threads,
    reconciles read from the event loop's worker threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[str, dict[Key, Manifest]] = {}
        self._owned: dict[Key, set[tuple[str, Key]]] = {}

    def _index(self, kind: str, key: Key, obj: Manifest | None) -> Key | None:
        old = self._objects.setdefault(kind, {}).get(key)
        for o in (old, obj):
            owner = _owner(o) if o is not None else None
            if owner is not None:
                self._owned.setdefault(owner, set()).discard((kind, key))
        owner = _owner(obj) if obj is not None else None
        if obj is None:
            self._objects[kind].pop(key, None)
        else:
            self._objects[kind][key] = obj
            if owner is not None:
                self._owned.setdefault(owner, set()).add((kind, key))
        return owner or (_owner(old) if old is not None else None)

    def put(self, kind: str, obj: Manifest) -> Key | None:
        """Store `obj` as a watch delivered it; returns its owner."""
        meta = obj.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        with self._lock:
            return self._index(kind, key, _slim(obj, kind))

    def drop(self, kind: str, namespace: str, name: str) -> Key | None:
        """Forget `name` (a watch's DELETED event); returns its owner."""
        with self._lock:
            return self._index(kind, (namespace, name), None)

    def replace(self, kind: str, namespace: str | None, objs: Iterable[Manifest]) -> set[Key]:
        """A fresh listing of `kind` (in `namespace`, or everywhere): the owners that changed."""
        fresh = {}
        for obj in objs:
            meta = obj.get("metadata") or {}
            fresh[(meta.get("namespace", ""), meta.get("name", ""))] = _slim(obj, kind)
        changed: set[Key] = set()
        with self._lock:
            held = self._objects.setdefault(kind, {})
            scope = [k for k in held if namespace is None or k[0] == namespace]
            for key in scope:
                if key not in fresh and (owner := self._index(kind, key, None)):
                    changed.add(owner)
            for key, obj in fresh.items():
                if held.get(key) != obj and (owner := self._index(kind, key, obj)):
                    changed.add(owner)
        return changed

    def children(self, namespace: str, owner: str) -> dict[str, list[Manifest]]:
        """The owner's children by kind (copies are not made: treat them as read-only)."""
        out: dict[str, list[Manifest]] = {}
        with self._lock:
            for kind, key in self._owned.get((namespace, owner), ()):
                obj = self._objects.get(kind, {}).get(key)
                if obj is not None:
                    out.setdefault(kind, []).append(obj)
        return out

    def size(self) -> int:
        with self._lock:
            return sum(len(objs) for objs in self._objects.values())

    def held(self, kind: str, namespace: str, name: str) -> str | None:
        """The resourceVersion held for `kind` `namespace`/`name`, None when none is held."""
        with self._lock:
            return resource_version(self._objects.get(kind, {}).get((namespace, name)))


class Reflector:
    """List, then watch, one kind in one scope, forever; re-list on every reconnect."""

    def __init__(
        self,
        api: client.ApiClient,
        kind: Kind,
        namespace: str | None,
        store: Sink,
        notify: Callable[[Key], None],
        on_request: Callable[[str, str], None] | None = None,
        selector: str | None = SELECTOR,
        max_backoff: float = MAX_BACKOFF_SECONDS,
    ) -> None:
        self.api = api
        self.kind = kind
        self.namespace = namespace
        self.store = store
        self.notify = notify
        self.on_request = on_request or (lambda kind, verb: None)
        self.selector = selector
        self.max_backoff = max_backoff
        self.synced = threading.Event()
        """Set by the first successful listing, never cleared: the store holds a full view."""
        self.stopped = threading.Event()
        self.watching = False
        """True from a successful listing until its watch ends or fails."""
        self.changed_at = time.monotonic()
        """When `watching` last flipped (or the reflector was made)."""
        self.last_error = ""
        self.thread = threading.Thread(
            target=self._run, name=f"reflector-{kind.kind}-{namespace or 'all'}", daemon=True
        )

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()

    def watching_value(self) -> float:
        """`watching` as a gauge reads it."""
        return 1.0 if self.watching else 0.0

    def _set_watching(self, watching: bool, error: str = "") -> None:
        if watching and self.last_error:
            log.info("Watching %s again (%s)", self.kind.plural, self.namespace or "all namespaces")
        if watching != self.watching:
            self.watching, self.changed_at = watching, time.monotonic()
        self.last_error = error

    def _run(self) -> None:
        failures = 0
        while not self.stopped.is_set():
            try:
                self._list_and_watch()
                failures = 0
                self._set_watching(False)
            except Exception as e:  # any failure: list again after a short pause
                failures += 1
                delay = backoff(failures, 0.5, self.max_backoff)
                if isinstance(e, ApiError) and e.status == 404:
                    error = f"the API server does not serve {self.kind.plural}.{self.kind.group}"
                    if self.kind.group:
                        error += " (is its CRD installed?)"
                    if self.kind.optional:  # none can exist: an empty view is a full one
                        for changed in self.store.replace(self.kind.kind, self.namespace, []):
                            self.notify(changed)
                        self.synced.set()
                else:
                    error = str(e)
                self._set_watching(False, error)
                log.warning(
                    "Watch of %s failed: %s; re-listing in %.1fs", self.kind.kind, error, delay
                )
                self.stopped.wait(delay)

    def _list_and_watch(self) -> None:
        # One generic LIST and WATCH by path for every kind: the table says where it lives.
        resource_path = self.kind.path(self.namespace)
        selector = [("labelSelector", self.selector)] if self.selector else []
        self.on_request(self.kind.kind, "LIST")
        listed = json.loads(send(self.api, "GET", resource_path, query=selector).read())
        for changed in self.store.replace(
            self.kind.kind, self.namespace, listed.get("items") or []
        ):
            self.notify(changed)
        self.synced.set()
        self._set_watching(True)
        timeout = random.randint(*WATCH_SECONDS)
        watch = [
            ("watch", "true"),
            ("resourceVersion", listed["metadata"]["resourceVersion"]),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout)),
        ]
        self.on_request(self.kind.kind, "WATCH")
        response = send(
            self.api, "GET", resource_path, query=selector + watch, timeout=timeout + 60
        ).response  # the raw urllib3 response, read line by line as events arrive
        try:
            for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                if self.stopped.is_set():
                    return
                if line:
                    self._apply(json.loads(line))
        finally:
            # Close before releasing: a half-read stream must not go back into the pool.
            response.close()
            response.release_conn()

    def _apply(self, event: Mapping[str, Any]) -> None:
        change, raw = event["type"], event["object"]
        if change == "ERROR":  # e.g. 410 Gone: the resourceVersion expired; list again
            raise ApiError(raw.get("code", 0), raw.get("reason", ""), raw.get("message", ""))
        if change == "BOOKMARK":
            return
        meta = raw.get("metadata") or {}
        if change == "DELETED":
            owner = self.store.drop(self.kind.kind, meta.get("namespace", ""), meta["name"])
        else:
            owner = self.store.put(self.kind.kind, raw)
        if owner is not None:
            self.notify(owner)


def wait_synced(reflectors: Iterable[Reflector], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    return all(r.synced.wait(max(0.0, deadline - time.monotonic())) for r in reflectors)

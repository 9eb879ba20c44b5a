"""The operator's view of every child it manages, fed by watches: reconciles read it, not the API.

One reflector per kind (and per namespace when the operator is namespaced) lists the objects
labelled `app.kubernetes.io/managed-by=pdmtp`, replaces its slice of the store with the result, and
watches from the list's resourceVersion. Any reconnect, for whatever reason, lists again and
replaces the slice, so an object deleted while no watch was open never lingers. Every change
reports the owning PDDeployment's key so its reconcile is queued.

The store also takes the API server's answers to the operator's own writes (`put`, `drop`), so
a reconcile that follows a write sees it even before the watch delivers it; an event older than
what the store holds (by resourceVersion) is ignored.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client, watch

from pdmtp.api import vocabulary as v

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name)
SELECTOR = f"{v.LABEL_MANAGED_BY}={v.MANAGED_BY}"
WATCH_SECONDS = (240, 360)
"""Server-side watch timeout, randomised so reflectors do not re-list in step."""


@dataclass(frozen=True)
class Kind:
    """A child kind and the client calls that list it cluster-wide or in one namespace."""

    name: str
    list_all: Callable[..., Any]
    list_namespaced: Callable[..., Any]


def child_kinds(api: client.ApiClient) -> list[Kind]:
    core, apps, net = client.CoreV1Api(api), client.AppsV1Api(api), client.NetworkingV1Api(api)
    return [
        Kind(
            "Deployment", apps.list_deployment_for_all_namespaces, apps.list_namespaced_deployment
        ),
        Kind("Pod", core.list_pod_for_all_namespaces, core.list_namespaced_pod),
        Kind("Service", core.list_service_for_all_namespaces, core.list_namespaced_service),
        Kind(
            "ServiceAccount",
            core.list_service_account_for_all_namespaces,
            core.list_namespaced_service_account,
        ),
        Kind(
            "NetworkPolicy",
            net.list_network_policy_for_all_namespaces,
            net.list_namespaced_network_policy,
        ),
        Kind(
            "ControllerRevision",
            apps.list_controller_revision_for_all_namespaces,
            apps.list_namespaced_controller_revision,
        ),
    ]


def _owner(obj: Mapping[str, Any]) -> Key | None:
    meta = obj.get("metadata") or {}
    owner = (meta.get("labels") or {}).get(v.LABEL_NAME)
    return (meta.get("namespace", ""), owner) if owner else None


def _newer_or_equal(new: Mapping[str, Any], old: Mapping[str, Any]) -> bool:
    # resourceVersions are opaque, but etcd's are increasing integers; where both parse,
    # never let a late event roll the store back past a write it already holds.
    try:
        return int(new["metadata"]["resourceVersion"]) >= int(old["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return True


def _slim(obj: Obj, kind: str) -> Obj:
    obj["kind"] = kind
    # managedFields are the bulk of an object and nothing here reads them.
    (obj.get("metadata") or {}).pop("managedFields", None)
    return obj


class ChildStore:
    """Children by kind and by owning PDDeployment. Thread-safe: reflectors write from threads,
    reconciles read from the event loop's worker threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[str, dict[Key, Obj]] = {}
        self._owned: dict[Key, set[tuple[str, Key]]] = {}

    def _index(self, kind: str, key: Key, obj: Obj | None) -> Key | None:
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

    def put(self, kind: str, obj: Obj) -> Key | None:
        """Store `obj` unless the store already holds a newer version; returns its owner."""
        meta = obj.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        with self._lock:
            current = self._objects.get(kind, {}).get(key)
            if current is not None and not _newer_or_equal(obj, current):
                return None
            return self._index(kind, key, _slim(obj, kind))

    def drop(self, kind: str, namespace: str, name: str) -> Key | None:
        with self._lock:
            return self._index(kind, (namespace, name), None)

    def replace(self, kind: str, namespace: str | None, objs: Iterable[Obj]) -> set[Key]:
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

    def children(self, namespace: str, owner: str) -> dict[str, list[Obj]]:
        """The owner's children by kind (copies are not made: treat them as read-only)."""
        out: dict[str, list[Obj]] = {}
        with self._lock:
            for kind, key in self._owned.get((namespace, owner), ()):
                obj = self._objects.get(kind, {}).get(key)
                if obj is not None:
                    out.setdefault(kind, []).append(obj)
        return out

    def size(self) -> int:
        with self._lock:
            return sum(len(objs) for objs in self._objects.values())


class Reflector:
    """List, then watch, one kind in one scope, forever; re-list on every reconnect."""

    def __init__(
        self,
        api: client.ApiClient,
        kind: Kind,
        namespace: str | None,
        store: ChildStore,
        notify: Callable[[Key], None],
        on_request: Callable[[str, str], None] | None = None,
    ) -> None:
        self.api = api
        self.kind = kind
        self.namespace = namespace
        self.store = store
        self.notify = notify
        self.on_request = on_request or (lambda kind, verb: None)
        self.synced = threading.Event()
        self.stopped = threading.Event()
        self.thread = threading.Thread(
            target=self._run, name=f"reflector-{kind.name}-{namespace or 'all'}", daemon=True
        )

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()

    def _call(self) -> tuple[Callable[..., Any], dict[str, Any]]:
        if self.namespace is None:
            return self.kind.list_all, {}
        return self.kind.list_namespaced, {"namespace": self.namespace}

    def _run(self) -> None:
        failures = 0
        while not self.stopped.is_set():
            try:
                self._list_and_watch()
                failures = 0
            except Exception as e:  # any failure: list again after a short pause
                failures += 1
                delay = min(30.0, 0.5 * 2**failures) * (1 + random.random() / 4)
                log.warning(
                    "Watch of %s failed (%s); re-listing in %.1fs", self.kind.name, e, delay
                )
                self.stopped.wait(delay)

    def _list_and_watch(self) -> None:
        call, scope = self._call()
        self.on_request(self.kind.name, "LIST")
        response = call(**scope, label_selector=SELECTOR, _preload_content=False)
        listed = json.loads(response.data)
        for changed in self.store.replace(
            self.kind.name, self.namespace, listed.get("items") or []
        ):
            self.notify(changed)
        self.synced.set()
        timeout = random.randint(*WATCH_SECONDS)
        self.on_request(self.kind.name, "WATCH")
        stream = watch.Watch()  # type: ignore[no-untyped-call]
        try:
            for event in stream.stream(  # type: ignore[no-untyped-call]
                call,
                **scope,
                label_selector=SELECTOR,
                resource_version=listed["metadata"]["resourceVersion"],
                allow_watch_bookmarks=True,
                timeout_seconds=timeout,
                _request_timeout=timeout + 60,
                deserialize=False,  # raw dicts: typed models would only be thrown away
            ):
                if self.stopped.is_set():
                    return
                change, raw = event["type"], event["object"]
                if change == "BOOKMARK":
                    continue
                meta = raw.get("metadata") or {}
                if change == "DELETED":
                    owner = self.store.drop(self.kind.name, meta.get("namespace", ""), meta["name"])
                else:
                    owner = self.store.put(self.kind.name, raw)
                if owner is not None:
                    self.notify(owner)
        finally:
            stream.stop()  # type: ignore[no-untyped-call]


def wait_synced(reflectors: Iterable[Reflector], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    return all(r.synced.wait(max(0.0, deadline - time.monotonic())) for r in reflectors)

"""The one adapter over the Kubernetes API for the reconciler's writes: apply, scale, delete,
patch status, post events. Raw JSON in and out (the core reads plain camelCase dicts), retries on
conflicts, throttling and server errors; NotFound is not an error where it means "done". Reads come
from the watch-fed cache (`pdmtp.cache`), not from here.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from kubernetes import client, config

from pdmtp.api import vocabulary as v
from pdmtp.api.kinds import BY_KIND, EVENT, LEASE
from pdmtp.backoff import backoff

log = logging.getLogger(__name__)

FIELD_MANAGER = "pdmtp"
RETRIED_STATUSES = frozenset({409, 429, 500, 502, 503, 504})
T = TypeVar("T")


class ApiError(Exception):
    def __init__(self, status: int, reason: str, body: str) -> None:
        super().__init__(f"{status} {reason}: {body[:500]}")
        self.status = status
        self.reason = reason
        self.body = body

    @property
    def message(self) -> str:
        """The API server's own message (a Status object's `message`), else the raw body."""
        try:
            text = json.loads(self.body).get("message")
        except (ValueError, AttributeError):
            text = None
        return str(text or self.body or self.reason)[:1000]


def load_client(kubeconfig: str | None = None) -> client.ApiClient:
    """In-cluster config when running in a pod, else the kubeconfig."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, client_configuration=configuration
        )
    return client.ApiClient(configuration)


def path(
    kind: str,
    namespace: str,
    name: str | None = None,
    subresource: str = "",
    version: str | None = None,
) -> str:
    """The REST path of a kind's object; `version` overrides the table's (a served one)."""
    table = BY_KIND[kind]
    if version is not None and version != table.version:
        table = dataclasses.replace(table, version=version)
    return table.path(namespace, name, subresource)


def send(
    api: client.ApiClient,
    method: str,
    resource_path: str,
    *,
    query: Iterable[tuple[str, str]] = (),
    body: Any = None,
    content_type: str = "application/json",
    timeout: float | None = None,
) -> Any:
    """One request, its body left unread (a watch streams it); a status >= 300 raises ApiError."""
    m, url, headers, payload, _ = api.param_serialize(
        method,
        resource_path,
        query_params=list(query),
        header_params={"Content-Type": content_type, "Accept": "application/json"},
        body=body,
        auth_settings=["BearerToken"],
    )
    response = api.call_api(m, url, header_params=headers, body=payload, _request_timeout=timeout)
    if response.status >= 300:
        raw = response.read()  # type: ignore[no-untyped-call]
        raise ApiError(response.status, response.reason or "", _text(raw))
    return response


def _version(manifest: Mapping[str, Any]) -> str | None:
    """The version part of a manifest's apiVersion (`group/version` or `version`)."""
    api_version = str(manifest.get("apiVersion") or "")
    return api_version.rsplit("/", 1)[-1] or None


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw or "")


def replacing_merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch (RFC 7386) that turns `old` into `new`: a merge patch merges nested
    objects key by key, so a key `new` dropped, at any depth, must be sent as null (or the API
    server keeps it, e.g. a stale status.rollout.canaryTrafficPercent). Lists replace whole."""
    patch: dict[str, Any] = {k: None for k in old if k not in new}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            patch[key] = replacing_merge_patch(before, value)
        else:
            patch[key] = value
    return patch


class Kube:
    """Synchronous calls (the controller runs them in a worker thread)."""

    def __init__(
        self,
        api: client.ApiClient,
        attempts: int = 5,
        base_delay: float = 0.2,
        on_request: Callable[[str], None] | None = None,
        fence: Callable[[str], None] | None = None,
    ) -> None:
        self.api = api
        self.fence = fence
        """Asked right before every write is sent (each retry too); raises to stop it. Leader
        election's fence (`pdmtp.election`): a process that lost its Lease writes nothing."""
        self.attempts = attempts
        self.base_delay = base_delay
        self.on_request = on_request
        self.versions: dict[str, str] = {}
        """Kind -> the API version to address it at, where the server's differs from the
        table's (the Workload API: v1beta1 on 1.37, v1alpha2 on 1.36)."""

    def _path(
        self, kind: str, namespace: str, name: str | None = None, subresource: str = ""
    ) -> str:
        return path(kind, namespace, name, subresource, self.versions.get(kind))

    def served_version(self, group: str, versions: Iterable[str], plural: str) -> str | None:
        """The first of `versions` of API `group` that the server serves `plural` at, or None
        (discovery; a group it does not know is None, not an error)."""
        for version in versions:
            try:
                listing = self._request("GET", f"/apis/{group}/{version}", verb="DISCOVERY")
            except ApiError as e:
                if e.status == 404:
                    continue
                raise
            if any(r.get("name") == plural for r in listing.get("resources") or []):
                return version
        return None

    def _request(
        self,
        method: str,
        resource_path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        verb: str | None = None,
        conditional: bool = False,
        fenced: bool = True,
    ) -> dict[str, Any]:
        """`conditional`: the body names the resourceVersion it was decided on, so a 409 means
        the view was stale; it is raised, not retried. `fenced`: a write that the fence may
        stop (all but the Lease's own)."""

        def once() -> dict[str, Any]:
            if fenced and method != "GET" and self.fence is not None:
                self.fence(f"{method} {resource_path}")
            if self.on_request is not None:
                self.on_request(verb or method)
            response = send(
                self.api,
                method,
                resource_path,
                query=(query or {}).items(),
                body=body,
                content_type=content_type,
            )
            text = _text(response.read())
            return json.loads(text) if text else {}

        return self._retrying(once, RETRIED_STATUSES - {409} if conditional else RETRIED_STATUSES)

    def _retrying(self, call: Callable[[], T], retried: frozenset[int]) -> T:
        for attempt in range(self.attempts):
            try:
                return call()
            except ApiError as e:
                if e.status not in retried or attempt == self.attempts - 1:
                    raise
                delay = backoff(attempt, self.base_delay, jitter=1.0)
                log.info("Retrying after %s (attempt %d, %.2fs)", e.status, attempt + 1, delay)
                time.sleep(delay)
        raise AssertionError("unreachable")

    # ---- reads (the CLI's; the operator reads its caches) ----------------------------------

    def read(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return self._request("GET", self._path(kind, namespace, name))
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def list_objects(self, kind: str, namespace: str, selector: str) -> list[dict[str, Any]]:
        result = self._request(
            "GET", self._path(kind, namespace), query={"labelSelector": selector}, verb="LIST"
        )
        items: list[dict[str, Any]] = result.get("items") or []
        # A LIST's items carry no kind of their own; give them theirs, as the cache's items have.
        return [{**item, "kind": kind} for item in items]

    def patch(
        self, kind: str, namespace: str, name: str, body: Any, content_type: str
    ) -> dict[str, Any]:
        return self._request(
            "PATCH", self._path(kind, namespace, name), body=body, content_type=content_type
        )

    # ---- the leader Lease (never fenced: it is how the fence opens) -------------------------

    def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._request("GET", LEASE.path(namespace, name))
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def write_lease(self, body: Mapping[str, Any], create: bool) -> dict[str, Any]:
        """Create the Lease, or replace it over the resourceVersion its body names (409 when
        another candidate wrote first)."""
        meta = body["metadata"]
        if create:
            target, method = LEASE.path(meta["namespace"]), "POST"
        else:
            target, method = LEASE.path(meta["namespace"], meta["name"]), "PUT"
        return self._request(method, target, body=body, conditional=True, fenced=False)

    # ---- writes ---------------------------------------------------------------------------

    def apply(
        self, manifest: Mapping[str, Any], resource_version: str | None = None
    ) -> dict[str, Any]:
        """Server-side apply: creates or updates, owning the fields we render. With
        `resource_version`, only over that version of the object (409 otherwise)."""
        meta = manifest["metadata"]
        if resource_version is not None:
            manifest = {**manifest, "metadata": {**meta, "resourceVersion": resource_version}}
        return self._request(
            "PATCH",
            path(manifest["kind"], meta["namespace"], meta["name"], version=_version(manifest)),
            query={"fieldManager": FIELD_MANAGER, "force": "true"},
            body=manifest,
            content_type="application/apply-patch+yaml",
            conditional=resource_version is not None,
        )

    def scale(
        self, namespace: str, name: str, replicas: int, resource_version: str | None = None
    ) -> dict[str, Any] | None:
        """The scaled Deployment, or None when it is gone. With `resource_version`, only over
        that version of the object (409 otherwise)."""
        body: dict[str, Any] = {"spec": {"replicas": replicas}}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            return self._request(
                "PATCH",
                path("Deployment", namespace, name),
                body=body,
                content_type="application/merge-patch+json",
                conditional=resource_version is not None,
            )
        except ApiError as e:
            if e.status != 404:
                raise
            return None

    def delete(self, kind: str, namespace: str, name: str) -> None:
        try:
            self._request(
                "DELETE",
                self._path(kind, namespace, name),
                body={"propagationPolicy": "Background"},
            )
        except ApiError as e:
            if e.status != 404:
                raise

    def event(self, obj: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """Post a core/v1 Event about `obj` (shown by `kubectl describe`)."""
        meta = obj.get("metadata") or {}
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {
            "metadata": {
                "generateName": f"{meta.get('name', 'pdmtp')}.",
                "namespace": meta.get("namespace"),
            },
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", v.API_VERSION),
                "kind": obj.get("kind", v.KIND),
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self._request("POST", EVENT.path(meta.get("namespace", "")), body=body)

    def patch_status(
        self,
        namespace: str,
        name: str,
        new: Mapping[str, Any],
        old: Mapping[str, Any],
        kind: str = v.KIND,
        resource_version: str | None = None,
    ) -> dict[str, Any] | None:
        """Replace .status with `new` (a merge patch that also clears fields `new` dropped, at
        any depth);
        the object written, or None when it is gone. With `resource_version`, only over that
        version of the object (409 otherwise: the status was decided on a stale view, or
        another writer, such as a newer leader, wrote since)."""
        body: dict[str, Any] = {"status": replacing_merge_patch(old, new)}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            return self._request(
                "PATCH",
                self._path(kind, namespace, name, "status"),
                body=body,
                content_type="application/merge-patch+json",
                conditional=resource_version is not None,
            )
        except ApiError as e:
            if e.status != 404:  # deleted meanwhile: nothing to report on
                raise
            return None

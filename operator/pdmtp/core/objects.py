"""Plain API objects, read: metadata, times as status writes them, a pod's readiness and URL, the
cordoned nodes, and a short list of names for a message. Every other observation is built on
these."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from pdmtp.api import vocabulary as v

Obj = Mapping[str, Any]
"""A Kubernetes object as the API and the caches give it: plain JSON, read only. The one
definition; every module that reads objects imports it from here."""

Manifest = dict[str, Any]
"""An object as plain JSON that its owner may still change: a child the render is writing, or an
entry the shell's cache trims in place."""

Key = tuple[str, str]
"""An object's (namespace, name): what the work queue, the caches and the loops key on."""


def parse_time(value: str | None) -> float | None:
    """RFC 3339 (as the API server writes it) to epoch seconds."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def format_time(epoch: float) -> str:
    """Epoch seconds to RFC 3339 in UTC, second precision (metav1.Time)."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def metadata_of(obj: Obj | None) -> Obj:
    """The object's metadata ({} when it has none, or there is no object)."""
    return (obj or {}).get("metadata") or {}


def labels_of(obj: Obj) -> Mapping[str, str]:
    return metadata_of(obj).get("labels") or {}


def annotations_of(obj: Obj) -> Mapping[str, str]:
    return metadata_of(obj).get("annotations") or {}


def name_of(obj: Obj) -> str:
    return str(metadata_of(obj).get("name", ""))


def is_terminating(obj: Obj | None) -> bool:
    return bool(metadata_of(obj).get("deletionTimestamp"))


def created_at(obj: Obj) -> float | None:
    """When the API server created the object (epoch seconds; None: not recorded)."""
    return parse_time(metadata_of(obj).get("creationTimestamp"))


def pod_ready(pod: Obj) -> bool:
    """Running, Ready and not on its way out: the only pods that may take traffic."""
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or is_terminating(pod):
        return False
    conditions = status.get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def is_leaving(pod: Obj) -> bool:
    """Marked to leave routing before it is removed (`core.rollout.removal`)."""
    return v.ANNOTATION_LEAVING in annotations_of(pod)


def serves(pod: Obj) -> bool:
    """Ready and not leaving: counted as serving capacity and listed by its routers."""
    return pod_ready(pod) and not is_leaving(pod)


def pod_url(ip: str, port: int) -> str:
    """`http://<pod IP>:<port>`, an IPv6 address bracketed (only IPv6 has colons)."""
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}"


def engine_url(ip: str) -> str:
    """The URL of an engine pod's OpenAI server."""
    return pod_url(ip, v.ENGINE_HTTP_PORT)


UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
"""The taint the node controller puts on a cordoned node (`kubectl cordon`, `kubectl drain`)."""


def cordoned_nodes(nodes: Iterable[Obj]) -> frozenset[str]:
    """Nodes marked unschedulable (cordoned, as a drain begins)."""
    out = set()
    for node in nodes:
        spec = node.get("spec") or {}
        taints = spec.get("taints") or []
        if spec.get("unschedulable") or any(t.get("key") == UNSCHEDULABLE_TAINT for t in taints):
            out.add(name_of(node))
    return frozenset(out)


class Named(Protocol):
    """A fact as `describe` names it (a `Wait`, or one read back from the status)."""

    @property
    def object(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def message(self) -> str: ...


def describe(facts: Sequence[Named], limit: int = 3) -> str:
    """The first `limit` facts in words, and how many more: a bounded message."""
    named = ", ".join(f"{w.object} ({w.reason}: {w.message})" for w in facts[:limit])
    more = len(facts) - limit
    return named + (f" and {more} more" if more > 0 else "")


def resource_version(obj: Obj | None) -> str | None:
    """The object's resourceVersion (None: no object, or none given): what a conditional write
    names and an expectation waits for."""
    return metadata_of(obj).get("resourceVersion") or None

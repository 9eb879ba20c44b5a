"""The thin shell's own logic: the API adapter's retries and the work queue's guarantees."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from pdmtp import rolloutctl
from pdmtp.kube import ApiError, Kube, replacing_merge_patch
from pdmtp.workqueue import WorkQueue


@dataclass
class Response:
    status: int
    body: Any = None
    reason: str = ""

    def read(self) -> bytes:
        return json.dumps(self.body or {}).encode()


@dataclass
class FakeApi:
    """Stands in for kubernetes.client.ApiClient: records requests, answers from a script."""

    answers: list[Response]
    calls: list[dict[str, Any]] = field(default_factory=list)

    def param_serialize(self, method: str, resource_path: str, **kw: Any) -> tuple[Any, ...]:
        query = "&".join(f"{k}={v}" for k, v in kw.get("query_params") or [])
        return method, f"{resource_path}?{query}", kw["header_params"], kw.get("body"), None

    def call_api(
        self, method: str, url: str, header_params: Any, body: Any = None, **_: Any
    ) -> Response:
        self.calls.append({"method": method, "url": url, "headers": header_params, "body": body})
        return self.answers.pop(0)


def kube(*answers: Response) -> tuple[Kube, FakeApi]:
    api = FakeApi(list(answers))
    verbs: list[str] = []
    k = Kube(api, base_delay=0.001, on_request=verbs.append)  # type: ignore[arg-type]
    return k, api


MANIFEST = {"kind": "Deployment", "metadata": {"name": "d", "namespace": "ns"}, "spec": {}}


def test_apply_is_a_forced_server_side_apply() -> None:
    k, api = kube(Response(200, {"kind": "Deployment"}))
    k.apply(MANIFEST)
    (call,) = api.calls
    assert call["method"] == "PATCH"
    assert call["url"].startswith("/apis/apps/v1/namespaces/ns/deployments/d?")
    assert "fieldManager=pdmtp" in call["url"] and "force=true" in call["url"]
    assert call["headers"]["Content-Type"] == "application/apply-patch+yaml"


@pytest.mark.parametrize("status", [409, 429, 500, 503])
def test_conflicts_throttling_and_server_errors_are_retried(status: int) -> None:
    k, api = kube(Response(status), Response(status), Response(200, {}))
    k.apply(MANIFEST)
    assert len(api.calls) == 3


def test_client_errors_are_not_retried() -> None:
    k, api = kube(Response(422, {"message": "invalid"}))
    with pytest.raises(ApiError) as e:
        k.apply(MANIFEST)
    assert e.value.status == 422 and len(api.calls) == 1


def test_retries_give_up() -> None:
    k, api = kube(*[Response(503)] * 5)
    with pytest.raises(ApiError):
        k.apply(MANIFEST)
    assert len(api.calls) == 5


def test_not_found_means_done_for_delete_scale_and_status() -> None:
    k, api = kube(Response(404), Response(404), Response(404))
    k.delete("Deployment", "ns", "gone")
    k.scale("ns", "gone", 0)
    k.patch_status("ns", "gone", {"a": 1}, {})
    assert [c["method"] for c in api.calls] == ["DELETE", "PATCH", "PATCH"]


def test_status_patch_clears_fields_the_new_status_dropped() -> None:
    k, api = kube(Response(200, {}))
    k.patch_status("ns", "x", {"conditions": []}, {"conditions": [1], "lookahead": {"a": 1}})
    assert api.calls[0]["body"] == {"status": {"conditions": [], "lookahead": None}}
    assert api.calls[0]["url"].startswith(
        "/apis/pdmtp.io/v1alpha1/namespaces/ns/pddeployments/x/status"
    )


def test_status_patch_clears_fields_dropped_inside_nested_objects() -> None:
    # A merge patch merges objects key by key: a canary hold's share, gone from the new rollout
    # record, must be sent as null or the API server keeps showing it.
    k, api = kube(Response(200, {}))
    old = {"rollout": {"phase": "CanaryHold", "canaryTrafficPercent": 50, "revision": "b"}}
    new = {"rollout": {"phase": "Complete", "revision": "a"}, "revisions": [{"r": "a"}]}
    k.patch_status("ns", "x", new, old)
    assert api.calls[0]["body"] == {
        "status": {
            "rollout": {"phase": "Complete", "revision": "a", "canaryTrafficPercent": None},
            "revisions": [{"r": "a"}],
        }
    }


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ({"a": {"b": {"c": 1, "d": 2}}, "e": [1, 2]}, {"a": {"b": {"c": 1}}, "e": [1]}),
        ({"a": {"b": 1}}, {"a": 2}),
        ({"a": 1}, {"a": {"b": 1}}),
        ({"a": {"b": 1}, "x": 1}, {}),
        ({}, {"a": {"b": None}}),
    ],
)
def test_a_replacing_merge_patch_applied_to_old_gives_new(
    old: dict[str, Any], new: dict[str, Any]
) -> None:
    assert merge_patched(old, replacing_merge_patch(old, new)) == without_nulls(new)


def merge_patched(target: Any, patch: Any) -> Any:
    """RFC 7386's MergePatch, as the API server applies a merge-patch+json body."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patched(result.get(key), value)
    return result


def without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    return value


def test_rollout_history_reads_listed_controller_revisions() -> None:
    # A LIST's items carry no kind; the history must still find them, oldest first.
    def record(number: int, revision: str) -> dict[str, Any]:
        labels = {"pdmtp.io/name": "pd", "pdmtp.io/revision": revision}
        return {
            "metadata": {"name": f"pd-{revision}-x", "labels": labels, "creationTimestamp": "t"},
            "revision": number,
            "data": {"spec": {"speculative": {"numSpeculativeTokens": number}}},
        }

    items = [record(2, "bbbb"), record(1, "aaaa")]
    k, api = kube(Response(200, {"kind": "ControllerRevisionList", "items": items}))
    records = rolloutctl.history(k, "ns", "pd")
    assert [(r.number, r.revision) for r in records] == [(1, "aaaa"), (2, "bbbb")]
    assert "/apis/apps/v1/namespaces/ns/controllerrevisions?" in api.calls[0]["url"]
    table = rolloutctl.format_history(records).splitlines()
    assert table[1].split()[:2] == ["1", "aaaa"] and '"numSpeculativeTokens": 2' in table[2]


def test_work_queue_deduplicates_and_serialises_a_key() -> None:
    async def scenario() -> list[tuple[str, str]]:
        q = WorkQueue()
        a, b = ("ns", "a"), ("ns", "b")
        q.add(a)
        q.add(a)
        q.add(b)
        assert len(q) == 2
        first = await q.get()
        q.add(first)  # changed while being worked on: not handed out again yet...
        second = await q.get()
        assert second != first and len(q) == 0
        q.done(first)  # ...but re-queued once the pass ends
        assert len(q) == 1
        return [first, second, await q.get()]

    order = asyncio.run(scenario())
    assert order == [("ns", "a"), ("ns", "b"), ("ns", "a")]


def test_webhook_certificate_names_the_host_and_address(tmp_path: Any) -> None:
    from cryptography import x509
    from pdmtp.webhook import self_signed

    cert_path, key_path, pem = self_signed(["pdmtp-operator.pdmtp-system.svc", "0.0.0.0"], tmp_path)
    cert = x509.load_pem_x509_certificate(pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["pdmtp-operator.pdmtp-system.svc"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["0.0.0.0"]
    assert cert_path.read_bytes() == pem and oct(key_path.stat().st_mode)[-3:] == "600"


def _child(name: str, owner: str, rv: str, ns: str = "ns", **extra: Any) -> dict[str, Any]:
    meta = {"name": name, "namespace": ns, "resourceVersion": rv}
    meta["labels"] = {"pdmtp.io/name": owner}
    meta["managedFields"] = [{"manager": "pdmtp"}]
    return {"metadata": meta, **extra}


def test_child_store_indexes_by_owner_in_the_order_the_watch_delivers() -> None:
    from pdmtp.cache import ChildStore

    store = ChildStore()
    assert store.put("Deployment", _child("a-1", "a", "10")) == ("ns", "a")
    assert store.put("Pod", _child("a-1-x", "a", "11")) == ("ns", "a")
    assert store.put("Deployment", _child("b-1", "b", "12")) == ("ns", "b")
    kids = store.children("ns", "a")
    assert sorted(kids) == ["Deployment", "Pod"] and kids["Deployment"][0]["kind"] == "Deployment"
    assert "managedFields" not in kids["Deployment"][0]["metadata"]
    # Each event replaces what the store holds: a watch delivers them in order, so no
    # resourceVersion is compared (they are opaque).
    store.put("Deployment", _child("a-1", "a", "13", spec={"replicas": 7}))
    store.put("Deployment", _child("a-1", "a", "9", spec={"replicas": 2}))
    assert store.children("ns", "a")["Deployment"][0]["spec"] == {"replicas": 2}
    # Relabelled to another owner: it moves.
    store.put("Pod", _child("a-1-x", "b", "14"))
    assert "Pod" not in store.children("ns", "a") and "Pod" in store.children("ns", "b")
    assert store.drop("Deployment", "ns", "b-1") == ("ns", "b")
    assert store.children("ns", "b") == {"Pod": [store.children("ns", "b")["Pod"][0]]}


def test_a_relisting_drops_what_is_gone_and_reports_the_owners_that_changed() -> None:
    from pdmtp.cache import ChildStore

    store = ChildStore()
    store.put("Pod", _child("a-1", "a", "1"))
    store.put("Pod", _child("b-1", "b", "2"))
    store.put("Pod", _child("c-1", "c", "3", ns="other"))
    # Listing namespace ns again: a-1 unchanged, b-1 deleted meanwhile, d-1 new.
    changed = store.replace("Pod", "ns", [_child("a-1", "a", "1"), _child("d-1", "d", "5")])
    assert changed == {("ns", "b"), ("ns", "d")}
    assert store.children("ns", "b") == {} and store.children("other", "c") != {}
    assert store.size() == 3


@dataclass
class Streamed:
    """A watch's raw response: events arrive in chunks that need not end at a line."""

    chunks: list[bytes]
    closed: bool = False

    def stream(self, amt: Any = None, decode_content: Any = None) -> Any:
        return iter(self.chunks)

    def close(self) -> None:
        self.closed = True

    def release_conn(self) -> None:
        assert self.closed, "a half-read stream must not go back into the pool"


@dataclass
class WatchResponse(Response):
    response: Streamed = field(default_factory=lambda: Streamed([]))


def test_a_reflector_lists_then_watches_from_the_lists_resource_version() -> None:
    from pdmtp.api.kinds import DEPLOYMENT
    from pdmtp.cache import SELECTOR, ChildStore, Reflector

    store = ChildStore()
    store.put("Deployment", _child("stale", "c", "1"))  # deleted while no watch was open
    events = [
        {"type": "ADDED", "object": _child("b-1", "b", "8")},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}},
        {"type": "DELETED", "object": _child("a-1", "a", "10")},
    ]
    stream = b"".join(json.dumps(e).encode() + b"\n" for e in events)
    watch = Streamed([stream[:30], stream[30:-5], stream[-5:]])
    listed = {"metadata": {"resourceVersion": "7"}, "items": [_child("a-1", "a", "6")]}
    api = FakeApi([Response(200, listed), WatchResponse(200, response=watch)])
    notified: list[tuple[str, str]] = []
    reflector = Reflector(api, DEPLOYMENT, "ns", store, notified.append)  # type: ignore[arg-type]
    reflector._list_and_watch()

    assert reflector.synced.is_set() and watch.closed
    assert sorted(notified) == [("ns", "a"), ("ns", "a"), ("ns", "b"), ("ns", "c")]
    assert store.children("ns", "b")["Deployment"][0]["kind"] == "Deployment"
    assert store.children("ns", "a") == {} and store.children("ns", "c") == {}
    list_url, watch_url = (c["url"] for c in api.calls)
    assert list_url == f"/apis/apps/v1/namespaces/ns/deployments?labelSelector={SELECTOR}"
    assert watch_url.startswith(f"{list_url}&watch=true&resourceVersion=7&allowWatchBookmarks=")


def test_a_watch_error_ends_the_watch_so_the_reflector_lists_again() -> None:
    from pdmtp.api.kinds import POD
    from pdmtp.cache import ChildStore, Reflector

    gone = {"type": "ERROR", "object": {"code": 410, "reason": "Expired", "message": "too old"}}
    watch = Streamed([json.dumps(gone).encode() + b"\n"])
    listed = {"metadata": {"resourceVersion": "7"}, "items": []}
    api = FakeApi([Response(200, listed), WatchResponse(200, response=watch)])
    reflector = Reflector(api, POD, None, ChildStore(), lambda key: None)  # type: ignore[arg-type]
    with pytest.raises(ApiError) as e:
        reflector._list_and_watch()
    assert e.value.status == 410 and watch.closed
    assert api.calls[0]["url"].startswith("/api/v1/pods?")  # everywhere: no namespace

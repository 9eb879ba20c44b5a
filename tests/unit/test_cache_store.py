"""The watch-fed stores (`pdmtp.cache`) and the expectations that give the operator
read-your-writes without writing into them (`pdmtp.expectations`).

The ghost pod this pins down came from a cluster-tier run: the operator marked a decode pod as
leaving while the Deployment controller deleted that pod. The watch's DELETED event was applied
before the PATCH's answer, and when that answer was put into the store it brought the pod back;
no later event names a deleted pod, so the ghost held the revision at "D1/2, scaling" until the
next re-list, minutes later. A write's answer no longer enters the store at all.
"""

from __future__ import annotations

from typing import Any

import pytest
from pdmtp.api import vocabulary as v
from pdmtp.api.kinds import POD
from pdmtp.cache import ChildStore, Reflector, Table
from pdmtp.controller import Controller, Options
from pdmtp.core.actions import Annotate, Apply, Delete
from pdmtp.expectations import Expectation, Expectations, after_delete, after_write
from pdmtp.metrics import Metrics

NAMESPACE, OWNER = "ns", "pd"
KEY = (NAMESPACE, OWNER)


def pod(name: str, resource_version: str, **meta: Any) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {
            "namespace": NAMESPACE,
            "name": name,
            "resourceVersion": resource_version,
            "labels": {v.LABEL_NAME: OWNER},
            **meta,
        },
    }


def pods_of(store: ChildStore) -> list[str]:
    return sorted(p["metadata"]["name"] for p in store.children(NAMESPACE, OWNER).get("Pod", []))


class AnsweringKube:
    """Accepts every write and answers with the object at `answer`'s resourceVersion."""

    def __init__(self, answer: str | None) -> None:
        self.answer = answer
        self.api = None

    def _object(self, name: str) -> dict[str, Any] | None:
        return None if self.answer is None else pod(name, self.answer)

    def patch(self, kind: str, ns: str, name: str, body: Any, content_type: str) -> Any:
        return self._object(name)

    def apply(self, manifest: dict[str, Any], resource_version: str | None = None) -> Any:
        return self._object(manifest["metadata"]["name"])

    def delete(self, kind: str, ns: str, name: str) -> None:
        return None


def controller(answer: str | None) -> Controller:
    return Controller(AnsweringKube(answer), Options(), Metrics())  # type: ignore[arg-type]


def watch(store: ChildStore, change: str, obj: dict[str, Any]) -> None:
    reflector = Reflector(None, POD, NAMESPACE, store, lambda key: None)  # type: ignore[arg-type]
    reflector._apply({"type": change, "object": obj})


MARK = Annotate("decode-a", {v.ANNOTATION_LEAVING: "scale-down"}, leaving=True)


def test_a_write_s_late_answer_does_not_bring_back_a_pod_the_watch_deleted() -> None:
    c = controller(answer="12")
    watch(c.watches.store, "ADDED", pod("decode-a", "10"))
    watch(c.watches.store, "DELETED", pod("decode-a", "14"))
    c.executor.apply_one(KEY, MARK)  # its answer (version 12) was sent before the deletion
    assert pods_of(c.watches.store) == []
    assert c.expectations.wait(KEY, c.watches.held) is None  # the deletion shows the write


def test_a_mark_is_awaited_until_the_watch_shows_it() -> None:
    c = controller(answer="12")
    watch(c.watches.store, "ADDED", pod("decode-a", "10"))
    c.executor.apply_one(KEY, MARK)
    assert c.watches.store.held("Pod", NAMESPACE, "decode-a") == "10"  # the answer is not stored
    assert c.expectations.wait(KEY, c.watches.held) is not None
    watch(c.watches.store, "MODIFIED", pod("decode-a", "12"))
    assert c.expectations.wait(KEY, c.watches.held) is None


def test_a_create_is_awaited_until_the_watch_adds_it() -> None:
    c = controller(answer="3")
    manifest = {"kind": "Pod", "metadata": {"name": "router-x", "namespace": NAMESPACE}}
    c.executor.apply_one(KEY, Apply(manifest, exists=False))
    assert pods_of(c.watches.store) == [] and c.expectations.pending(KEY) == 1
    watch(c.watches.store, "ADDED", pod("router-x", "3"))
    assert c.expectations.wait(KEY, c.watches.held) is None


def test_a_write_that_changed_nothing_leaves_nothing_to_wait_for() -> None:
    c = controller(answer="10")  # a server-side apply of what is there: same version
    watch(c.watches.store, "ADDED", pod("decode-a", "10"))
    c.executor.apply_one(KEY, MARK)
    assert c.expectations.pending(KEY) == 0


@pytest.mark.parametrize(
    ("change", "obj"),
    [
        ("DELETED", pod("decode-a", "11")),
        ("MODIFIED", pod("decode-a", "11", deletionTimestamp="2026-12-06T00:00:00Z")),
    ],
    ids=["gone", "terminating"],
)
def test_a_delete_is_met_by_the_deletion_or_the_grace_period_s_version(
    change: str, obj: dict[str, Any]
) -> None:
    c = controller(answer=None)
    watch(c.watches.store, "ADDED", pod("decode-a", "10"))
    c.executor.apply_one(KEY, Delete("Pod", "decode-a"))
    assert c.expectations.wait(KEY, c.watches.held) is not None
    watch(c.watches.store, change, obj)
    assert c.expectations.wait(KEY, c.watches.held) is None


def test_deleting_what_the_store_does_not_hold_leaves_nothing_to_wait_for() -> None:
    assert after_delete("Pod", "decode-a", None) is None
    assert after_write("Pod", "decode-a", "10", None) is None  # the object was gone
    assert after_write("Pod", "decode-a", None, "12") is None  # the watch saw it go
    assert after_write("Pod", "decode-a", None, "12", created=True) is not None


def test_an_expectation_the_watch_never_meets_expires() -> None:
    now = [100.0]
    expectations = Expectations(ttl=30.0, clock=lambda: now[0])
    expectations.expect(KEY, Expectation("Pod", "decode-a", "10"))
    held = {"decode-a": "10"}

    def lookup(kind: str, namespace: str, name: str) -> str | None:
        return held.get(name)

    now[0] = 110.0
    assert expectations.wait(KEY, lookup) == pytest.approx(20.0)
    now[0] = 130.0
    assert expectations.wait(KEY, lookup) is None and expectations.pending(KEY) == 0


def test_resource_versions_are_compared_for_equality_only() -> None:
    """Opaque versions: neither the store nor an expectation reads them as numbers."""
    store = ChildStore()
    watch(store, "ADDED", pod("decode-a", "b7"))
    watch(store, "MODIFIED", pod("decode-a", "a3"))  # "smaller", and still the newer event
    assert store.held("Pod", NAMESPACE, "decode-a") == "a3"
    assert Expectation("Pod", "decode-a", "b7").met("a3")
    assert not Expectation("Pod", "decode-a", "b7").met("b7")


def test_the_pddeployment_table_answers_for_status_writes() -> None:
    c = controller(answer=None)
    c.watches.pdds.put("PDDeployment", pod(OWNER, "5"))
    c.expectations.expect(KEY, after_write("PDDeployment", OWNER, "5", "6"))
    assert c.expectations.wait(KEY, c.watches.held) is not None
    c.watches.pdds.put("PDDeployment", pod(OWNER, "6"))
    assert c.expectations.wait(KEY, c.watches.held) is None
    c.expectations.expect(KEY, after_write("PDDeployment", OWNER, "6", "7"))
    c.watches.pdds.drop("PDDeployment", NAMESPACE, OWNER)
    c.on_pdd_change(KEY)  # the PDDeployment is gone: so is what it waited for
    assert c.expectations.pending(KEY) == 0


def test_a_listing_is_the_whole_truth() -> None:
    table = Table()
    table.put("PDDeployment", pod("a", "1"))
    assert table.replace("PDDeployment", None, [pod("b", "2")]) == {
        (NAMESPACE, "a"),
        (NAMESPACE, "b"),
    }
    assert table.held(NAMESPACE, "a") is None and table.held(NAMESPACE, "b") == "2"

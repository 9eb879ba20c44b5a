"""The operator's stores (`pdmtp.cache`): what a late answer to the operator's own write may and
may not do once the watch has reported a deletion.

The race this pins down came from a cluster-tier run: the operator marked a decode pod as leaving
while the Deployment controller deleted that pod; the watch's DELETED event was applied before the
PATCH's answer, which then put the pod back. No later event names a deleted pod, so the ghost
held the revision at "D1/2, scaling" until the next re-list, minutes later.
"""

from __future__ import annotations

from typing import Any

import pytest
from pdmtp.api import vocabulary as v
from pdmtp.api.kinds import POD
from pdmtp.cache import ChildStore, Reflector, Table

NAMESPACE, OWNER = "ns", "pd"


def pod(name: str, resource_version: int) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": NAMESPACE,
            "name": name,
            "resourceVersion": str(resource_version),
            "labels": {v.LABEL_NAME: OWNER},
        }
    }


def pods_of(store: ChildStore) -> list[str]:
    return sorted(p["metadata"]["name"] for p in store.children(NAMESPACE, OWNER).get("Pod", []))


def test_a_late_answer_does_not_bring_back_a_pod_the_watch_deleted() -> None:
    store = ChildStore()
    store.put("Pod", pod("decode-a", 10))
    assert store.drop("Pod", NAMESPACE, "decode-a", "14") == (NAMESPACE, OWNER)
    # The answer to a PATCH sent before the deletion (resourceVersion 12) arrives now.
    assert store.put("Pod", pod("decode-a", 12)) is None
    assert pods_of(store) == []


def test_a_name_created_again_after_its_deletion_is_stored() -> None:
    store = ChildStore()
    store.put("Pod", pod("decode-a", 10))
    store.drop("Pod", NAMESPACE, "decode-a", "14")
    assert store.put("Pod", pod("decode-a", 20)) == (NAMESPACE, OWNER)
    assert pods_of(store) == ["decode-a"]
    # The tombstone went with it: a later deletion and a newer version behave as usual.
    store.drop("Pod", NAMESPACE, "decode-a", "25")
    assert store.put("Pod", pod("decode-a", 24)) is None
    assert store.put("Pod", pod("decode-a", 26)) is not None


def test_a_deletion_without_its_version_leaves_no_tombstone() -> None:
    """The operator's own DELETE answers with no version to compare: the watch's event will."""
    store = ChildStore()
    store.put("Pod", pod("decode-a", 10))
    store.drop("Pod", NAMESPACE, "decode-a")
    assert store.put("Pod", pod("decode-a", 11)) is not None


@pytest.mark.parametrize("scope", [NAMESPACE, None], ids=["namespaced", "cluster-wide"])
def test_a_listing_is_the_whole_truth_and_clears_the_tombstones(scope: str | None) -> None:
    store = ChildStore()
    store.put("Pod", pod("decode-a", 10))
    store.drop("Pod", NAMESPACE, "decode-a", "14")
    store.replace("Pod", scope, [pod("decode-b", 30)])
    assert pods_of(store) == ["decode-b"]
    assert store.put("Pod", pod("decode-a", 12)) is not None  # what a listing says goes


def test_tombstones_are_per_kind() -> None:
    store = ChildStore()
    store.drop("Pod", NAMESPACE, "pd-a", "14")
    assert store.put("Deployment", pod("pd-a", 12)) is not None


def test_the_pddeployment_table_refuses_a_late_answer_too() -> None:
    table = Table()
    table.put("PDDeployment", pod("pd", 10))
    table.drop("PDDeployment", NAMESPACE, "pd", "14")
    # A status write's answer, older than the deletion.
    assert table.put("PDDeployment", pod("pd", 12)) is None
    assert table.get((NAMESPACE, "pd")) is None
    assert table.put("PDDeployment", pod("pd", 15)) == (NAMESPACE, "pd")
    table.drop("PDDeployment", NAMESPACE, "pd", "16")
    table.replace("PDDeployment", None, [])
    assert table.put("PDDeployment", pod("pd", 12)) == (NAMESPACE, "pd")


def test_the_reflector_hands_the_deletion_version_to_the_store() -> None:
    store = ChildStore()
    woken: list[tuple[str, str]] = []
    reflector = Reflector(None, POD, NAMESPACE, store, woken.append)  # type: ignore[arg-type]
    reflector._apply({"type": "ADDED", "object": pod("decode-a", 10)})
    reflector._apply({"type": "DELETED", "object": pod("decode-a", 14)})
    assert store.put(POD.kind, pod("decode-a", 12)) is None
    assert woken == [(NAMESPACE, OWNER), (NAMESPACE, OWNER)]

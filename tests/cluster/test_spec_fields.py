"""What real clusters need, on a real API server: weights from a PVC bound to a local
PersistentVolume, a hub token by reference only, P/D pods of a revision sharing a rack, and a
literal credential refused at admission."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from builders import PDDBuilder, compat_revision, pdd
from cluster.kubehelpers import Cluster, wait_for
from kubernetes import client
from kubernetes.client.rest import ApiException
from operator_harness import (
    READY_DELAY,
    OperatorProcess,
    create_pdd,
    get_pdd,
    patch_spec,
    settled,
    wait_settled,
)
from pdmtp.api import vocabulary as v

RACK = "pdmtp.io/test-rack"


def engine_pods(cluster: Cluster, namespace: str, name: str) -> list[client.V1Pod]:
    pods = client.CoreV1Api(cluster.api_client).list_namespaced_pod(
        namespace, label_selector=f"{v.LABEL_NAME}={name}"
    )
    return [
        p
        for p in pods.items
        if p.metadata.labels.get(v.LABEL_ROLE) in v.ENGINE_ROLES
        and not p.metadata.deletion_timestamp
    ]


def test_pvc_weights_reach_available_in_both_roles(
    cluster: Cluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    core = client.CoreV1Api(cluster.api_client)
    pv = f"weights-{uuid.uuid4().hex[:8]}"
    # A local PersistentVolume made by the test, bound to the claim by the PV controller.
    core.create_persistent_volume(
        {
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "10Gi"},
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "pdmtp-test",
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": str(tmp_path / "weights")},
                "claimRef": {"namespace": namespace, "name": "weights"},
            },
        }
    )
    try:
        core.create_namespaced_persistent_volume_claim(
            namespace,
            {
                "metadata": {"name": "weights"},
                "spec": {
                    "accessModes": ["ReadOnlyMany"],
                    "storageClassName": "pdmtp-test",
                    "volumeName": pv,
                    "resources": {"requests": {"storage": "10Gi"}},
                },
            },
        )
        wait_for(
            lambda: (
                core.read_namespaced_persistent_volume_claim("weights", namespace).status.phase
                == "Bound"
            ),
            "PVC bound",
            60,
        )
        b = pdd("pvc").mtp(3, modules=3)
        b.spec["model"]["source"] = {"pvc": {"claimName": "weights", "subPath": "ckpt"}}
        create_pdd(cluster.api_client, namespace, b.dict())
        wait_settled(cluster.api_client, namespace, "pvc")
        pods = engine_pods(cluster, namespace, "pvc")
        assert {p.metadata.labels[v.LABEL_ROLE] for p in pods} == {"prefill", "decode"}
        for p in pods:
            (volume,) = [x for x in p.spec.volumes if x.name == "model"]
            assert volume.persistent_volume_claim.claim_name == "weights"
            container = p.spec.containers[0]
            assert container.args[2] == "/models/ckpt"
            assert any(m.mount_path == "/models" and m.read_only for m in container.volume_mounts)
    finally:
        core.delete_persistent_volume(pv)


def test_a_hub_token_is_referenced_never_copied(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    core = client.CoreV1Api(cluster.api_client)
    token = f"hf_{uuid.uuid4().hex}"
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": "hf"}, "stringData": {"token": token}}
    )
    b = pdd("gated")
    b.spec["model"]["source"] = {"hub": {"tokenSecretRef": {"name": "hf", "key": "token"}}}
    create_pdd(cluster.api_client, namespace, b.dict())
    obj = wait_settled(cluster.api_client, namespace, "gated")
    pods = engine_pods(cluster, namespace, "gated")
    assert len(pods) == 2
    for p in pods:
        env = {e.name: e for e in p.spec.containers[0].env}
        ref = env["HF_TOKEN"].value_from.secret_key_ref
        assert (ref.name, ref.key, env["HF_TOKEN"].value) == ("hf", "token", None)
    apps = client.AppsV1Api(cluster.api_client)
    serialized = json.dumps(
        [
            cluster.api_client.sanitize_for_serialization(x)
            for x in [*pods, *apps.list_namespaced_deployment(namespace).items]
        ]
    ) + json.dumps(obj)
    assert token not in serialized, "the token's value was copied somewhere"


def label_racks(cluster: Cluster, racks: dict[str, str] | None) -> list[str]:
    core = client.CoreV1Api(cluster.api_client)
    nodes = sorted(
        n.metadata.name for n in core.list_node().items if n.metadata.name.startswith("pdmtp-gpu-")
    )
    for i, node in enumerate(nodes):
        value = None if racks is None else ("a" if i < len(nodes) // 2 else "b")
        core.patch_node(node, {"metadata": {"labels": {RACK: value}}})
    return nodes


def racks_by_revision(cluster: Cluster, namespace: str, name: str) -> dict[str, set[str]]:
    core = client.CoreV1Api(cluster.api_client)
    rack_of = {n.metadata.name: (n.metadata.labels or {}).get(RACK) for n in core.list_node().items}
    out: dict[str, set[str]] = {}
    for p in engine_pods(cluster, namespace, name):
        if p.spec.node_name:
            rev = p.metadata.labels[v.LABEL_REVISION]
            out.setdefault(rev, set()).add(str(rack_of[p.spec.node_name]))
    return out


def test_prefill_and_decode_of_a_revision_share_a_rack(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    if cluster.local is None:
        pytest.skip("labels the local cluster's fake nodes")
    label_racks(cluster, {})
    try:
        annotations = {READY_DELAY: "300"}
        b: PDDBuilder = (
            pdd("rack")
            .mtp(3, modules=3)
            .prefill(replicas=2, podAnnotations=annotations)
            .decode(replicas=3, podAnnotations=annotations)
            .set(placement={"topologyKey": RACK, "spreadKey": "kubernetes.io/hostname"})
            .rollout(maxSurge=1, maxUnavailable=0, drainSeconds=1)
        )
        create_pdd(cluster.api_client, namespace, b.dict())
        wait_settled(cluster.api_client, namespace, "rack")
        first = racks_by_revision(cluster, namespace, "rack")
        assert all(len(r) == 1 for r in first.values()), first

        seen: list[dict[str, set[str]]] = []
        b.mtp(2, modules=3)
        patch_spec(cluster.api_client, namespace, "rack", b.dict()["spec"])

        def done() -> bool:
            seen.append(racks_by_revision(cluster, namespace, "rack"))
            o = get_pdd(cluster.api_client, namespace, "rack")
            return bool(
                o
                and settled(o)
                and o["status"]["currentRevision"] == compat_revision(b.build().spec)
            )

        wait_for(done, "rolled to the new revision", 120, interval=0.3)
        mixed = [s for s in seen if any(len(r) > 1 for r in s.values())]
        assert not mixed, f"a revision's pods in two racks: {mixed[:3]}"
        assert len(seen) > 5
    finally:
        label_racks(cluster, None)


def test_a_literal_hub_token_is_refused_at_admission(
    cluster: Cluster, namespace: str, crd: None
) -> None:
    b = pdd("leaky").prefill(env=[{"name": "HF_TOKEN", "value": "hf_literal"}])
    with pytest.raises(ApiException) as refused:
        create_pdd(cluster.api_client, namespace, b.dict())
    assert refused.value.status == 422
    assert "use valueFrom.secretKeyRef" in (refused.value.body or "")

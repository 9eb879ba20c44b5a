"""The product CRD at a real API server: every CEL rule rejects its bad object with its message,
and the samples are accepted (schema and CEL, no webhook)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import PDDBuilder, pdd
from cluster.kubehelpers import Cluster, install_crd
from kubernetes import client
from kubernetes.client.rest import ApiException
from pdmtp.api import vocabulary as v

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "pdmtp.io_pddeployments.yaml"


@pytest.fixture(scope="module")
def custom(cluster: Cluster) -> client.CustomObjectsApi:
    install_crd(cluster.api_client, CRD)
    return client.CustomObjectsApi(cluster.api_client)


def create(custom: client.CustomObjectsApi, namespace: str, body: dict[str, Any]) -> Any:
    return custom.create_namespaced_custom_object(
        v.GROUP, v.VERSION, namespace, v.PLURAL, body, field_validation="Strict"
    )


def rejection(
    custom: client.CustomObjectsApi, namespace: str, b: PDDBuilder | dict[str, Any]
) -> str:
    body = b if isinstance(b, dict) else b.dict()
    with pytest.raises(ApiException) as info:
        create(custom, namespace, body)
    # 422 for schema and CEL; 400 for the strict decoder's unknown fields.
    assert info.value.status in (400, 422), info.value.body
    message: str = json.loads(info.value.body)["message"]
    return message


@pytest.mark.parametrize("sample", sorted((REPO / "samples").glob("*.yaml")), ids=lambda p: p.name)
def test_samples_are_accepted(
    custom: client.CustomObjectsApi, namespace: str, sample: Path
) -> None:
    body = yaml.safe_load(sample.read_text())
    body["metadata"].pop("namespace", None)
    created = create(custom, namespace, body)
    # Defaults from the schema are filled in by the API server.
    assert created["spec"]["rollout"]["drainSeconds"] >= 0
    assert created["spec"]["engine"]["blockSize"] in (16, 64)


@pytest.mark.parametrize(
    ("builder", "message"),
    [
        (pdd("tp").prefill(tp=6).decode(tp=4), "must divide one another"),
        (
            pdd("flags").prefill(extra_args=["--speculative-config={}"]),
            "must not set flags owned by typed fields",
        ),
        (
            pdd("flags2").decode(extra_args=["--kv_transfer_config", "{}"]),
            "must not set flags owned by typed fields",
        ),
        (pdd("flags3").engine(extraArgs=["-tp", "2"]), "spec.engine.extraArgs must not set"),
        (
            pdd("ctx").decode(maxModelLen=1024).prefill(maxModelLen=2048),
            "spec.decode.maxModelLen must be >= spec.prefill.maxModelLen",
        ),
        (pdd("spec").no_speculation().prefill(k=2), "set spec.speculative"),
        (pdd("rdma").rdma(), "spec.kvTransfer.deviceNames must list the RDMA devices"),
        (pdd("roll").rollout(maxSurge=0, maxUnavailable=0), "cannot both be 0"),
        (pdd("env").decode(env=[{"name": "VLLM_HOST_IP", "value": "x"}]), "the operator owns them"),
        (pdd("a-name-that-is-far-too-long-for-child-objects-x"), "at most 40 characters"),
    ],
)
def test_cel_rules_reject_with_their_message(
    custom: client.CustomObjectsApi, namespace: str, builder: PDDBuilder, message: str
) -> None:
    assert message in rejection(custom, namespace, builder)


@pytest.mark.parametrize(
    ("builder", "message"),
    [
        (pdd("neg").prefill(replicas=-1), "spec.prefill.replicas"),
        (pdd("typo").decode(replicaz=2), 'unknown field "spec.decode.replicaz"'),
        (pdd("enum").engine(blockSize=24), "spec.engine.blockSize"),
        (pdd("proto").set(kvTransfer={"protocol": "ib"}), "spec.kvTransfer.protocol"),
        (
            pdd("method").set(speculative={"method": "magic", "numSpeculativeTokens": 2}),
            "spec.speculative.method",
        ),
        (pdd("k").mtp(99), "spec.speculative.numSpeculativeTokens"),
    ],
)
def test_schema_rejects_bad_values(
    custom: client.CustomObjectsApi, namespace: str, builder: PDDBuilder, message: str
) -> None:
    assert message in rejection(custom, namespace, builder)


def test_incompatible_but_well_formed_spec_passes_admission(
    custom: client.CustomObjectsApi, namespace: str
) -> None:
    """Agreement that needs the lookahead formula is the operator's job, not CEL's."""
    create(custom, namespace, pdd("later").mtp(3).prefill(k=2).dict())

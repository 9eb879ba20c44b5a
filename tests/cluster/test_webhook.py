"""The opt-in validating webhook: `kubectl apply` of an incompatible spec fails at admission with
the agreement rule's message; a compatible one is admitted. Served on 127.0.0.1 only."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from builders import pdd
from cluster.kubehelpers import Cluster, wait_for
from kubernetes import client
from operator_harness import (
    OperatorProcess,
    create_pdd,
    delete_webhook_configuration,
    refused_at_admission,
)
from pdmtp.webhook import MANAGED_CONFIGURATION


@pytest.fixture
def webhook_operator(
    cluster: Cluster,
    crd: None,
    namespace: str,
    tmp_path: Path,
) -> Iterator[OperatorProcess]:
    if cluster.local is None:
        pytest.skip("a containerised API server cannot reach a webhook on the host's loopback")
    op = OperatorProcess(cluster.kubeconfig, [namespace], tmp_path / "operator.log", webhook=True)
    op.start()
    admission = client.AdmissionregistrationV1Api(cluster.api_client)
    try:
        # kopf creates the configuration first and fills in its webhooks a moment later.
        wait_for(
            lambda: admission.read_validating_webhook_configuration(MANAGED_CONFIGURATION).webhooks,
            "webhook configuration with its webhook",
            30,
        )
        yield op
    finally:
        op.stop()
        print("---- operator log ----\n" + op.log_tail(80))
        delete_webhook_configuration(cluster.api_client)


def test_incompatible_spec_is_refused_at_admission(
    cluster: Cluster, namespace: str, webhook_operator: OperatorProcess
) -> None:
    config = client.AdmissionregistrationV1Api(
        cluster.api_client
    ).read_validating_webhook_configuration(MANAGED_CONFIGURATION)
    (hook,) = config.webhooks
    assert hook.failure_policy == "Ignore"
    assert hook.client_config.url.startswith("https://127.0.0.1:")

    # Admitted at first, maybe: the webhook is not called until its configuration is read.
    body = wait_for(
        lambda: refused_at_admission(cluster.api_client, namespace),
        "the webhook to refuse",
        30,
        interval=0.5,
    )
    assert "denied the request" in body and "MTPModulesUnknown" in body
    assert "spec.model.mtpModules" in body
    create_pdd(cluster.api_client, namespace, pdd("good").mtp(3, modules=3).prefill(k=3).dict())

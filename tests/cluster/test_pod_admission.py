"""Admission that knows the pod: every row of the pod-field corpus (cluster/pod_corpus.py,
docs/validation-corpus.md) proved against the real API server.

Schema and CEL rows: `kubectl apply --dry-run=server` and offline `pdmtp validate` both refuse,
with the row's words. Rule rows (pdmtp's own check where CEL holds only a necessary part): the
CRD stores the object, `pdmtp validate`, `--server` and the webhook refuse it in the rule's words.
Webhook rows: without the webhook the API server stores the object (the CRD cannot know); `pdmtp
validate --server` and, with the operator's webhook served on 127.0.0.1, `kubectl apply` refuse
it in the Deployment validation's words. And a spec change whose children
would be refused, made while the webhook is away, never disturbs the serving pods.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cluster.kubehelpers import Cluster, wait_for
from cluster.pod_corpus import CASES, Case, doc
from kubernetes import client
from operator_harness import OperatorProcess, delete_webhook_configuration
from pdmtp.webhook import MANAGED_CONFIGURATION

PDMTP = Path(sys.executable).parent / "pdmtp"
SCHEMA = [c for c in CASES if c.layer in ("schema", "CEL")]
RULE = [c for c in CASES if c.layer == "rule"]
WEBHOOK = [c for c in CASES if c.layer == "webhook"]
ACCEPTED = [c for c in CASES if c.layer == "accepted"]


def ids(cases: list[Case]) -> list[str]:
    return [c.name for c in cases]


@pytest.fixture(scope="module")
def corpus_namespace(cluster: Cluster, crd: None) -> Iterator[str]:
    name = f"t-pod-corpus-{uuid.uuid4().hex[:6]}"
    api = client.CoreV1Api(cluster.api_client)
    api.create_namespace({"metadata": {"name": name, "labels": {"pdmtp.io/test": "true"}}})
    wait_for(lambda: api.read_namespaced_service_account("default", name), "default SA", 30)
    yield name
    api.delete_namespace(name)


def write(case: Case, tmp_path: Path) -> Path:
    path = tmp_path / "pdd.yaml"
    path.write_text(yaml.safe_dump(doc(case), sort_keys=False))
    return path


def pdmtp_validate(path: Path, *server: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PDMTP), "validate", *server, str(path)], capture_output=True, text=True, timeout=60
    )


def validate_server(cluster: Cluster, ns: str, path: Path) -> subprocess.CompletedProcess[str]:
    return pdmtp_validate(path, "--server", "--kubeconfig", str(cluster.kubeconfig), "-n", ns)


def kubectl_apply(cluster: Cluster, ns: str, path: Path) -> subprocess.CompletedProcess[str]:
    kubectl = cluster.local.bin_dir / "kubectl" if cluster.local else Path("kubectl")
    args = ["--kubeconfig", str(cluster.kubeconfig), "-n", ns, "apply", "--dry-run=server"]
    return subprocess.run(
        [str(kubectl), *args, "-f", str(path)], capture_output=True, text=True, timeout=60
    )


def refused(done: subprocess.CompletedProcess[str], words: str, exit_code: int = 2) -> None:
    out = done.stdout + done.stderr
    assert done.returncode == exit_code, out
    assert "Traceback" not in out
    assert words in out, out


@pytest.mark.parametrize("case", SCHEMA, ids=ids(SCHEMA))
def test_the_crd_and_validate_refuse(
    case: Case, cluster: Cluster, corpus_namespace: str, tmp_path: Path
) -> None:
    path = write(case, tmp_path)
    refused(pdmtp_validate(path), case.words)
    refused(kubectl_apply(cluster, corpus_namespace, path), case.words, exit_code=1)
    refused(validate_server(cluster, corpus_namespace, path), case.words)


@pytest.mark.parametrize("case", WEBHOOK + ACCEPTED, ids=ids(WEBHOOK + ACCEPTED))
def test_without_the_webhook_the_crd_stores_it(
    case: Case, cluster: Cluster, corpus_namespace: str, tmp_path: Path
) -> None:
    path = write(case, tmp_path)
    assert pdmtp_validate(path).returncode == 0
    done = kubectl_apply(cluster, corpus_namespace, path)
    assert done.returncode == 0, done.stderr
    server = validate_server(cluster, corpus_namespace, path)
    if case.layer == "accepted":
        assert server.returncode == 0, server.stdout + server.stderr
    else:
        refused(server, case.words)
        assert "ChildRejected: the API server would refuse Deployment/corpus-" in server.stdout


@pytest.mark.parametrize("case", RULE, ids=ids(RULE))
def test_validate_refuses_what_the_crd_cannot_decide(
    case: Case, cluster: Cluster, corpus_namespace: str, tmp_path: Path
) -> None:
    path = write(case, tmp_path)
    refused(pdmtp_validate(path), case.words)
    done = kubectl_apply(cluster, corpus_namespace, path)
    assert done.returncode == 0, done.stderr  # the CRD's CEL holds only the necessary part
    refused(validate_server(cluster, corpus_namespace, path), case.words)


@pytest.fixture(scope="module")
def webhook(
    cluster: Cluster, corpus_namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    if cluster.local is None:
        pytest.skip("a containerised API server cannot reach a webhook on the host's loopback")
    log = tmp_path_factory.mktemp("webhook") / "operator.log"
    op = OperatorProcess(cluster.kubeconfig, [corpus_namespace], log, webhook=True)
    op.start()
    admission = client.AdmissionregistrationV1Api(cluster.api_client)
    probe = doc(WEBHOOK[0])
    probe_path = log.parent / "probe.yaml"
    probe_path.write_text(yaml.safe_dump(probe))
    try:
        wait_for(
            lambda: admission.read_validating_webhook_configuration(MANAGED_CONFIGURATION),
            "webhook configuration",
            30,
        )
        # The configuration is read lazily by the API server: wait until the webhook answers.
        wait_for(
            lambda: kubectl_apply(cluster, corpus_namespace, probe_path).returncode != 0,
            "the webhook to refuse",
            30,
            interval=0.5,
        )
        yield op
    finally:
        op.stop()
        print("---- operator log ----\n" + op.log_tail(80))
        delete_webhook_configuration(cluster.api_client)


@pytest.mark.parametrize("case", WEBHOOK + RULE + ACCEPTED, ids=ids(WEBHOOK + RULE + ACCEPTED))
def test_the_webhook_dry_runs_the_children(
    case: Case, cluster: Cluster, corpus_namespace: str, webhook: OperatorProcess, tmp_path: Path
) -> None:
    path = write(case, tmp_path)
    done = kubectl_apply(cluster, corpus_namespace, path)
    if case.layer == "accepted":
        assert done.returncode == 0, done.stderr
        return
    refused(done, case.words, exit_code=1)
    assert "denied the request" in done.stderr
    if case.layer == "webhook":
        assert "ChildRejected" in done.stderr

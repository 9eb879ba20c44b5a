"""Admission the operator may rely on: ValidatingAdmissionPolicy (CEL) and a webhook on loopback."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cluster.kubehelpers import Cluster, wait_for
from kubernetes import client
from kubernetes.client.rest import ApiException

LOOPBACK = "127.0.0.1"


def _denied_with(create: Any, message: str) -> bool:
    """True once creating is refused with ``message``; policies and webhooks load lazily."""
    try:
        create()
    except ApiException as exc:
        if message in (exc.body or ""):
            return True
        raise
    return False


def test_validating_admission_policy_denies_with_its_message(
    cluster: Cluster, namespace: str
) -> None:
    adm = client.AdmissionregistrationV1Api(cluster.api_client)
    core = client.CoreV1Api(cluster.api_client)
    name = f"vap-{namespace}"
    message = "configmaps here must not carry the key 'forbidden'"
    adm.create_validating_admission_policy(
        {
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE", "UPDATE"],
                            "resources": ["configmaps"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": "!has(object.data) || !('forbidden' in object.data)",
                        "message": message,
                    }
                ],
            },
        }
    )
    adm.create_validating_admission_policy_binding(
        {
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        }
    )
    try:
        attempt = iter(range(1000))

        def create_bad() -> None:
            body = {"metadata": {"name": f"bad-{next(attempt)}"}, "data": {"forbidden": "x"}}
            core.create_namespaced_config_map(namespace, body)

        wait_for(lambda: _denied_with(create_bad, message), "policy enforced", timeout=30)
        core.create_namespaced_config_map(
            namespace, {"metadata": {"name": "good"}, "data": {"fine": "x"}}
        )
    finally:
        adm.delete_validating_admission_policy_binding(name)
        adm.delete_validating_admission_policy(name)


class _Webhook(BaseHTTPRequestHandler):
    message = "webhook says no"

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        request = review["request"]
        labels = request["object"]["metadata"].get("labels") or {}
        allowed = labels.get("pdmtp.io/webhook-test") != "deny"
        response: dict[str, Any] = {"uid": request["uid"], "allowed": allowed}
        if not allowed:
            response["status"] = {"code": 403, "message": self.message}
        body = json.dumps({**review, "response": response}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:  # keep test output quiet
        pass


@pytest.fixture
def loopback_webhook(tmp_path: Path) -> Iterator[tuple[str, bytes]]:
    """An HTTPS admission webhook on 127.0.0.1 with a throw-away self-signed cert."""
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"]
    san = f"subjectAltName=IP:{LOOPBACK}"
    files = ["-keyout", str(key), "-out", str(cert)]
    subprocess.run(
        ["openssl", "req", "-x509", *ec, *files, "-subj", "/CN=webhook", "-addext", san],
        check=True,
        capture_output=True,
    )
    server = ThreadingHTTPServer((LOOPBACK, 0), _Webhook)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://{LOOPBACK}:{server.server_address[1]}/validate", cert.read_bytes()
    finally:
        server.shutdown()
        server.server_close()


def test_apiserver_calls_a_webhook_on_loopback(
    cluster: Cluster, namespace: str, loopback_webhook: tuple[str, bytes]
) -> None:
    if cluster.local is None:
        pytest.skip("only a host-process apiserver can reach a webhook on this host's loopback")
    url, ca = loopback_webhook
    adm = client.AdmissionregistrationV1Api(cluster.api_client)
    core = client.CoreV1Api(cluster.api_client)
    name = f"hook-{namespace}"
    adm.create_validating_webhook_configuration(
        {
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "deny.webhook-test.pdmtp.io",
                    "clientConfig": {"url": url, "caBundle": base64.b64encode(ca).decode()},
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["configmaps"],
                        }
                    ],
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": namespace}
                    },
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 5,
                }
            ],
        }
    )
    try:
        attempt = iter(range(1000))

        def create_denied() -> None:
            body = {
                "metadata": {
                    "name": f"deny-{next(attempt)}",
                    "labels": {"pdmtp.io/webhook-test": "deny"},
                }
            }
            core.create_namespaced_config_map(namespace, body)

        wait_for(lambda: _denied_with(create_denied, _Webhook.message), "webhook called", 30)
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "allowed"}})
    finally:
        adm.delete_validating_webhook_configuration(name)

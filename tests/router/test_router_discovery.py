"""Why the operator does not use vllm-router 0.1.17's Kubernetes discovery with Mooncake.

The router is pointed at a loopback stand-in for the API server whose pods have loopback IPs
(127.0.0.1 for the prefill, ::1 for the decode: discovery dials every pod on one port, so the two
engines need two loopback addresses). The discovered prefill carries the bootstrap-port
annotation, yet the router never asks its bootstrap server for an engine_id, and the decode
request goes out without any kv_transfer_params: the decoder would recompute the whole prompt
and the prefill's KV would sit unclaimed until it times out, while every response is a 200.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from loopback import free_ports
from pdmtp.api.vocabulary import ANNOTATION_BOOTSTRAP_PORT, LABEL_NAME, LABEL_REVISION, LABEL_ROLE
from router.emulator import EngineFactory
from router.fake_kube import FakeKube
from router.harness import LOOPBACK, RouterProcess, completion_body, post

NAMESPACE = "pd"
ROUTER_ANNOTATION = "vllm.ai/bootstrap-port"  # fixed by the 0.1.17 launcher


def shared_port() -> int:
    """A port free on both 127.0.0.1 and ::1, or skip when there is no IPv6 loopback."""
    for _ in range(50):
        (port,) = free_ports(1)
        try:
            with socket.socket(socket.AF_INET6) as s:
                s.bind(("::1", port))
        except OSError as e:
            if e.errno == 99:  # EADDRNOTAVAIL: no ::1 here
                pytest.skip("no IPv6 loopback (::1) to host a second discovered pod")
            continue
        return port
    pytest.fail("no port free on both 127.0.0.1 and ::1")


def pod(name: str, ip: str, role: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": f"{name}-uid",
            "resourceVersion": "1",
            "labels": {LABEL_NAME: "demo", LABEL_ROLE: role, LABEL_REVISION: "r1"},
            "annotations": annotations,
        },
        "spec": {"containers": [{"name": "engine", "image": "engine"}]},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    fake = FakeKube(pods=[]).start()
    yield fake
    fake.stop()


def test_discovery_mode_never_learns_prefill_engine_ids(
    router_binary: Path, engine: EngineFactory, kube: FakeKube, tmp_path: Path
) -> None:
    port = shared_port()
    p = engine("prefill", "p0", http_port=port)
    d = engine("decode", "d0", host="::1", http_port=port)
    boot = str(p.bootstrap_port)
    kube.pods += [
        pod(
            "p0",
            "127.0.0.1",
            "prefill",
            {ROUTER_ANNOTATION: boot, ANNOTATION_BOOTSTRAP_PORT: boot},
        ),
        pod("d0", "::1", "decode", {}),
    ]
    selector = [f"{LABEL_NAME}=demo", f"{LABEL_REVISION}=r1"]
    router_port, metrics_port = free_ports(2)
    args = [
        "--vllm-pd-disaggregation",
        "--kv-connector",
        "mooncake",
        "--service-discovery",
        "--service-discovery-namespace",
        NAMESPACE,
        "--service-discovery-port",
        str(port),
        "--prefill-selector",
        *selector,
        f"{LABEL_ROLE}=prefill",
        "--decode-selector",
        *selector,
        f"{LABEL_ROLE}=decode",
        "--worker-startup-check-interval",
        "1",
        "--host",
        LOOPBACK,
        "--port",
        str(router_port),
        "--prometheus-host",
        LOOPBACK,
        "--prometheus-port",
        str(metrics_port),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env["KUBECONFIG"] = str(kube.write_kubeconfig(tmp_path / "kubeconfig", NAMESPACE))
    router = RouterProcess(router_binary, args, router_port, 0, env=env)
    try:
        router.start()  # ready = the HTTP server is up; the pods are added asynchronously
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            reply = post(router.base, "/v1/completions", completion_body())
            if reply.status == 200:
                break
            time.sleep(0.3)
        assert reply.status == 200, reply.body
    finally:
        router.stop()

    assert p.bootstrap_queries == 0
    p_req = p.generation_requests()[-1]
    assert p_req.body["kv_transfer_params"]["do_remote_decode"] is True
    assert "kv_transfer_params" not in d.generation_requests()[-1].body
    # What discovery asks of the API: list and watch pods in its namespace, nothing else.
    pods_path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    assert {(method, path) for method, path, _ in kube.calls} == {("GET", pods_path)}
    assert any(q.get("watch") == "true" for _, _, q in kube.calls)

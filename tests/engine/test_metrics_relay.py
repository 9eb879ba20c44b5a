"""The engine's metrics-only listener (pdmtp_engine.metrics_relay) and how the launcher starts
it: GET /metrics relayed from vLLM's API port, every other path and method refused there, so the
operator's NetworkPolicy can open this port alone to metrics scrapers. Loopback only."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from pdmtp.api import vocabulary
from pdmtp_engine import launcher, metrics_relay

METRICS = b'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0"} 2\n'


class FakeVllm(BaseHTTPRequestHandler):
    """vLLM's API port: /metrics and a route the relay must never reach."""

    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        FakeVllm.seen.append(self.path)
        body = METRICS if self.path == "/metrics" else b'{"data": []}'
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _serve(httpd: ThreadingHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def relay() -> Iterator[tuple[int, ThreadingHTTPServer]]:
    FakeVllm.seen = []
    vllm = ThreadingHTTPServer(("127.0.0.1", 0), FakeVllm)
    _serve(vllm)
    upstream = f"http://127.0.0.1:{vllm.server_address[1]}/metrics"
    httpd = metrics_relay.server(0, upstream, host="127.0.0.1")
    _serve(httpd)
    yield int(httpd.server_address[1]), vllm
    httpd.shutdown()
    vllm.shutdown()
    httpd.server_close()
    vllm.server_close()


def _request(port: int, method: str, path: str) -> tuple[int, bytes, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=b"{}" if method == "POST" else None)
        answer = conn.getresponse()
        return answer.status, answer.read(), answer.getheader("Content-Type") or ""
    finally:
        conn.close()


def test_relays_metrics_and_nothing_else(relay: tuple[int, ThreadingHTTPServer]) -> None:
    port, _ = relay
    status, body, kind = _request(port, "GET", "/metrics")
    assert (status, body) == (200, METRICS) and kind.startswith("text/plain; version=0.0.4")
    # The query string is dropped: it never becomes a path upstream.
    assert _request(port, "GET", "/metrics?x=/v1/models")[0] == 200
    for path in ("/v1/models", "/health", "/metrics/../v1/models", "/metricsx", "/"):
        assert _request(port, "GET", path)[0] == 404, path
    for method in ("POST", "PUT", "DELETE"):
        assert _request(port, method, "/metrics")[0] == 405, method
    assert FakeVllm.seen == ["/metrics", "/metrics"]


def test_an_unanswering_vllm_is_a_502(relay: tuple[int, ThreadingHTTPServer]) -> None:
    port, vllm = relay
    vllm.shutdown()
    vllm.server_close()
    assert _request(port, "GET", "/metrics")[0] == 502


def test_launcher_starts_the_relay_on_the_pods_port_against_vllms() -> None:
    serve = ["vllm", "serve", "/models/x", "--host", "0.0.0.0", "--port", "8100"]
    relay = launcher.metrics_relay_command(serve, {launcher.ENV_METRICS_PORT: "29100"})
    assert relay is not None and relay[1:3] == ["-m", "pdmtp_engine.metrics_relay"]
    upstream = "http://127.0.0.1:8100/metrics"
    assert relay[3:] == ["--host", "0.0.0.0", "--port", "29100", "--upstream", upstream]
    assert launcher.metrics_relay_command(serve, {}) is None
    # Where vLLM listens (a loopback-only test host binds 127.0.0.1), its default host otherwise.
    local = launcher.metrics_relay_command(
        [*serve, "--host=127.0.0.1"], {"PDMTP_METRICS_PORT": "1"}
    )
    assert local is not None and local[3:5] == ["--host", "127.0.0.1"]
    bare = launcher.metrics_relay_command(["vllm", "serve", "m"], {"PDMTP_METRICS_PORT": "1"})
    assert bare is not None and bare[3:5] == ["--host", "0.0.0.0"]
    assert launcher.api_port(["vllm", "serve", "m"]) == launcher.VLLM_DEFAULT_PORT
    assert launcher.api_port(["vllm", "serve", "m", "--port=9000"]) == 9000


def test_launcher_and_operator_spell_the_metrics_port_alike() -> None:
    assert launcher.ENV_METRICS_PORT == vocabulary.ENV_METRICS_PORT
    assert launcher.VLLM_DEFAULT_PORT == vocabulary.ENGINE_HTTP_PORT

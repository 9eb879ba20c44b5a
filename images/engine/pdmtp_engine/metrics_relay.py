"""The engine pod's metrics-only listener: GET /metrics, relayed from vLLM's API port, and nothing
else.

    python -m pdmtp_engine.metrics_relay --port 29100 --upstream http://127.0.0.1:8000/metrics

vLLM serves its Prometheus metrics on its API port, next to the OpenAI routes. A NetworkPolicy
works on ports, not paths, so the operator's policy opens this port, not the API's, to metrics
scrapers (pods or namespaces labelled `pdmtp.io/metrics-scraper: "true"`). The launcher starts
it beside vLLM when the pod's env names the port (PDMTP_METRICS_PORT). Any other path or method
is answered 404 or 405 without reaching vLLM; only the query string of /metrics is dropped, so
a scraper cannot reach another route through it.
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Final
from urllib.parse import urlsplit

METRICS_PATH: Final = "/metrics"
UPSTREAM_TIMEOUT_SECONDS: Final = 10.0
"""A scrape that vLLM does not answer in this long gets a 502 (Prometheus's default timeout is
10 s too)."""


def handler_for(upstream: str) -> type[BaseHTTPRequestHandler]:
    class MetricsOnly(BaseHTTPRequestHandler):
        server_version = "pdmtp-metrics-relay"

        def _reply(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:
            if urlsplit(self.path).path != METRICS_PATH:
                self._reply(404, b"only /metrics is served here\n")
                return
            try:
                with urllib.request.urlopen(upstream, timeout=UPSTREAM_TIMEOUT_SECONDS) as got:
                    body = got.read()
                    kind = got.headers.get("Content-Type", "text/plain")
            except (urllib.error.URLError, TimeoutError, OSError) as error:
                self._reply(502, f"vLLM's metrics are unavailable: {error}\n".encode())
                return
            self._reply(200, body, kind)

        do_HEAD = do_GET

        def _refuse(self) -> None:
            self._reply(405, b"GET /metrics only\n")

        do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per scrape would drown vLLM's log

    return MetricsOnly


def server(port: int, upstream: str, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    httpd = ThreadingHTTPServer((host, port), handler_for(upstream))
    httpd.daemon_threads = True
    return httpd


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pdmtp_engine.metrics_relay")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="vLLM's metrics URL")
    parser.add_argument("--host", default="0.0.0.0")
    args = parser.parse_args(argv)
    with server(args.port, args.upstream, args.host) as httpd:
        print(
            f"pdmtp-engine: metrics-only listener on {args.host}:{args.port} -> {args.upstream}",
            file=sys.stderr,
            flush=True,
        )
        httpd.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())

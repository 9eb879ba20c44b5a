"""A scrape relay for the kind alert test (tests/e2e/promkit.py): runs in a pod labelled
`pdmtp.io/metrics-scraper: "true"` and answers `GET /pods/<pod IP>/<port>/metrics` with that
pod's /metrics.

Why a relay: Prometheus runs on the host and reaches the cluster only through the API server's
pod proxy, which dials from the control-plane node; the engines' NetworkPolicy admits scrapers by
pod label, so that dial is refused, as it should be. This pod is a scraper the policy admits, and
the API server's proxy reaches it (nothing selects it).

Standard library only (it runs in the engine emulator's image, mounted from a ConfigMap). It
dials only pod IPs (literal addresses, no names) on the ports given with --port-allowed.
"""

from __future__ import annotations

import argparse
import ipaddress
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TIMEOUT_SECONDS = 5.0


def upstream_url(path: str, allowed_ports: frozenset[int]) -> str | None:
    """`/pods/<ip>/<port>/metrics` -> `http://<ip>:<port>/metrics`; None for anything else."""
    parts = path.split("?", 1)[0].strip("/").split("/")
    if len(parts) != 4 or parts[0] != "pods" or parts[3] != "metrics":
        return None
    try:
        address = ipaddress.ip_address(parts[1])
        port = int(parts[2])
    except ValueError:
        return None
    if port not in allowed_ports:
        return None
    host = f"[{address}]" if address.version == 6 else str(address)
    return f"http://{host}:{port}/metrics"


def handler_for(allowed_ports: frozenset[int]) -> type[BaseHTTPRequestHandler]:
    class Relay(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = upstream_url(self.path, allowed_ports)
            if url is None:
                self.send_error(404, "expected /pods/<pod IP>/<allowed port>/metrics")
                return
            try:
                with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as answer:
                    body = answer.read()
                    content_type = answer.headers.get("Content-Type", "text/plain")
            except (OSError, urllib.error.URLError) as exc:
                self.send_error(502, f"{url}: {exc}")
                return
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Quiet: one line per scrape would bury anything worth reading."""

    return Relay


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--listen", default="0.0.0.0")
    parser.add_argument("--listen-port", type=int, default=8080)
    parser.add_argument("--port-allowed", type=int, action="append", required=True)
    args = parser.parse_args()
    server = ThreadingHTTPServer(
        (args.listen, args.listen_port), handler_for(frozenset(args.port_allowed))
    )
    server.serve_forever()


if __name__ == "__main__":
    main()

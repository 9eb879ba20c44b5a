"""The operator's one HTTP server: `/healthz` (liveness), `/readyz` (readiness) and `/metrics`
(Prometheus), one aiohttp application on the event loop the controller runs on.

It listens wherever the command line asks: the health address and the metrics address (the same
one when they are equal), each serving every path, so a probe or a scrape needs no second
server, thread or library. The admission webhook stays on kopf's own server: kopf builds and
owns that one (its TLS, its certificate and the webhook configuration it manages), and offers
no way to add routes to it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web

from pdmtp.health import Health

Handler = Callable[[web.Request], Awaitable[web.Response]]
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The Prometheus text format, version 0.0.4 (what `prometheus_client` writes)."""


def app(judge: Callable[[], Health], exposition: Callable[[], bytes] | None) -> web.Application:
    """`/healthz` answers 500 when not live, `/readyz` 503 when not ready, both JSON;
    `/metrics` the exposition (absent when metrics are off)."""

    def health(passes: Callable[[Health], bool], failed: int) -> Handler:
        async def answer(_: web.Request) -> web.Response:
            verdict = judge()
            status = 200 if passes(verdict) else failed
            return web.Response(status=status, text=verdict.body(), content_type="application/json")

        return answer

    application = web.Application()
    application.add_routes(
        [
            web.get("/healthz", health(lambda h: h.live, 500)),
            web.get("/readyz", health(lambda h: h.ready, 503)),
        ]
    )
    if exposition is not None:
        write = exposition

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(body=write(), headers={"Content-Type": METRICS_CONTENT_TYPE})

        application.add_routes([web.get("/metrics", metrics)])
    return application


async def serve(application: web.Application, listens: Iterable[tuple[str, int]]) -> web.AppRunner:
    """Start `application` on every distinct (host, port) of `listens`; clean up the runner
    returned to stop it."""
    runner = web.AppRunner(application, handle_signals=False, access_log=None)
    await runner.setup()
    for host, port in dict.fromkeys(listens):
        await web.TCPSite(runner, host, port).start()
    return runner

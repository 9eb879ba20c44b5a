"""A loopback stand-in for the two kube-apiserver calls vllm-router's pod discovery makes.

It serves `GET .../pods` (list) and `GET .../pods?watch=true` (a held-open watch) from a fixed
set of pod objects and records every call, so a test can see exactly what the router asks the
API for. Only for characterising the router; the cluster tier uses a real API server.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web


@dataclass
class FakeKube:
    pods: list[dict[str, Any]]
    calls: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    port: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None
    _closed: bool = False

    def start(self) -> FakeKube:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout=10)
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        self._closed = True  # releases held watches, so cleanup need not wait them out
        if self._runner is not None:
            fut = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
            fut.result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._loop.close()
        self._loop = None

    def write_kubeconfig(self, path: Path, namespace: str) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "fake", "user": {"token": "fake"}}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": "fake", "namespace": namespace},
                }
            ],
            "current-context": "fake",
        }
        path.write_text(json.dumps(config))
        return path

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.calls.append((request.method, request.path, dict(request.query)))
        if request.method != "GET" or not request.path.endswith("/pods"):
            return web.json_response(
                {"kind": "Status", "status": "Failure", "code": 404}, status=404
            )
        if request.query.get("watch") in ("true", "1"):
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            # No events: hold the watch open until the server stops.
            while not self._closed:
                await asyncio.sleep(0.2)
            return resp
        pod_list = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}}
        return web.json_response({**pod_list, "items": self.pods})

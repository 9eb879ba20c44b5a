"""An emulated vLLM engine: the slice of vLLM's OpenAI server (and, for a prefill, the Mooncake
bootstrap server) that vllm-router touches.

Each engine runs its aiohttp apps on 127.0.0.1 in a private event loop on a daemon thread, so
sync tests can start, reconfigure and inspect it. It records every request it receives and can
be told to fail (HTTP status, dropped connection, or a delay).

The bootstrap `GET /query` body follows vLLM 0.33.0's `MooncakeBootstrapServer`: a map from the
data-parallel rank to `{engine_id, worker_addr: {tp_rank: {pp_rank: "host:port"}}}` (JSON keys are
strings). vLLM mints a fresh uuid4 engine_id each time an engine starts; `restart()` mimics that.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

Role = Literal["prefill", "decode"]
FailMode = Literal["status", "drop", "slow"]
LOOPBACK = "127.0.0.1"
MODEL = "emulated/model"
# Paths the failure switch applies to; health and model listing keep answering so the router
# keeps the engine in rotation, as a real engine whose generation fails would.
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")


@dataclass(frozen=True)
class Recorded:
    """One request as the engine saw it."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    at: float


@dataclass
class Failure:
    mode: FailMode
    status: int = 500
    delay: float = 0.0
    remaining: int | None = None
    """How many generation requests fail before the engine recovers; None = until cleared."""


@dataclass
class EngineEmulator:
    role: Role
    name: str
    host: str = LOOPBACK
    http_port: int = 0
    bootstrap_port: int = 0
    dp_ranks: int = 1
    engine_ids: list[str] = field(default_factory=list)
    requests: list[Recorded] = field(default_factory=list)
    bootstrap_queries: int = 0
    failure: Failure | None = None
    query_status: int = 200
    """What the bootstrap `/query` answers; anything but 200 comes with an error body."""

    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runners: list[web.AppRunner] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> EngineEmulator:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"emulator-{self.name}", daemon=True
        )
        self._thread.start()
        self._call(self._serve())
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._loop.close()
        self._loop = None

    def restart(self) -> None:
        """Stop and serve again on the same ports with new engine ids, like a restarted vLLM."""
        self._call(self._shutdown())
        self.engine_ids = []
        self._call(self._serve())

    def __enter__(self) -> EngineEmulator:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    # ---- inspection and control ------------------------------------------------------------

    @property
    def _authority_host(self) -> str:
        return f"[{self.host}]" if ":" in self.host else self.host

    @property
    def url(self) -> str:
        return f"http://{self._authority_host}:{self.http_port}"

    @property
    def bootstrap_addr(self) -> str:
        return f"http://{self._authority_host}:{self.bootstrap_port}"

    @property
    def engine_id(self) -> str:
        return self.engine_ids[0]

    def generation_requests(self) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.path in GENERATION_PATHS]

    def fail(
        self, mode: FailMode, *, status: int = 500, delay: float = 0.0, times: int | None = None
    ) -> None:
        self.failure = Failure(mode=mode, status=status, delay=delay, remaining=times)

    def heal(self) -> None:
        self.failure = None

    # ---- internals -------------------------------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, None]) -> None:
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    async def _serve(self) -> None:
        if not self.engine_ids:
            self.engine_ids = [str(uuid.uuid4()) for _ in range(self.dp_ranks)]
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/chat/completions", self._generate)
        # Anything else the router might probe is recorded and answered 404, so a test sees it.
        app.router.add_route("*", "/{tail:.*}", self._unknown)
        self.http_port = await self._listen(app, self.http_port)
        if self.role == "prefill":
            boot = web.Application()
            boot.router.add_get("/query", self._query)
            self.bootstrap_port = await self._listen(boot, self.bootstrap_port)

    async def _listen(self, app: web.Application, port: int) -> int:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, port, reuse_address=True)
        await site.start()
        self._runners.append(runner)
        return int(runner.addresses[0][1])

    async def _shutdown(self) -> None:
        runners, self._runners = self._runners, []
        for runner in runners:
            await runner.cleanup()

    async def _record(self, request: web.Request) -> Recorded:
        raw = await request.read()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        rec = Recorded(request.method, request.path, dict(request.headers), body, time.monotonic())
        with self._lock:
            self.requests.append(rec)
        return rec

    async def _health(self, request: web.Request) -> web.StreamResponse:
        await self._record(request)
        return web.Response(status=200)

    async def _models(self, request: web.Request) -> web.StreamResponse:
        await self._record(request)
        card = {"id": MODEL, "object": "model", "created": 0, "owned_by": "vllm"}
        return web.json_response({"object": "list", "data": [card]})

    async def _unknown(self, request: web.Request) -> web.StreamResponse:
        await self._record(request)
        return web.json_response({"error": "not emulated"}, status=404)

    async def _query(self, request: web.Request) -> web.StreamResponse:
        self.bootstrap_queries += 1
        if self.query_status != 200:
            return web.json_response({"detail": "not ready"}, status=self.query_status)
        body = {
            str(rank): {
                "engine_id": engine_id,
                # A Mooncake worker's RPC address; the router never dials it, the decoder does.
                "worker_addr": {"0": {"0": f"{self.host}:{17000 + rank}"}},
            }
            for rank, engine_id in enumerate(self.engine_ids)
        }
        return web.json_response(body)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        rec = await self._record(request)
        failure = self.failure
        if failure is not None:
            if failure.remaining is not None:
                failure.remaining -= 1
                if failure.remaining <= 0:
                    self.failure = None
            if failure.mode == "slow":
                await asyncio.sleep(failure.delay)
            elif failure.mode == "status":
                error = {
                    "object": "error",
                    "message": f"{self.name} failed",
                    "code": failure.status,
                }
                return web.json_response(error, status=failure.status)
            else:  # drop: close the socket with no response at all
                assert request.transport is not None
                request.transport.abort()
                raise asyncio.CancelledError
        body = rec.body if isinstance(rec.body, dict) else {}
        chat = request.path == "/v1/chat/completions"
        text = self.output_text()
        if body.get("stream"):
            return await self._stream(request, chat, text)
        return web.json_response(self._completion(chat, text, body))

    def output_text(self) -> str:
        """What this engine generates: names the engine, so a test can tell who answered."""
        return f"from {self.name}"

    def _completion(self, chat: bool, text: str, body: dict[str, Any]) -> dict[str, Any]:
        created = int(time.time())
        usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "length",
            }
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
            obj = "text_completion"
        out: dict[str, Any] = {
            "id": f"{self.name}-{uuid.uuid4().hex[:8]}",
            "object": obj,
            "created": created,
            "model": body.get("model", MODEL),
            "choices": [choice],
            "usage": usage,
        }
        if self.role == "prefill":
            # vLLM 0.33.0's Mooncake producer returns no params here (request_finished -> None):
            # the router builds the decode's params from /query, not from this response.
            out["kv_transfer_params"] = None
        return out

    async def _stream(self, request: web.Request, chat: bool, text: str) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        ident = f"{self.name}-{uuid.uuid4().hex[:8]}"
        for word in text.split(" "):
            if chat:
                choice: dict[str, Any] = {"index": 0, "delta": {"content": word + " "}}
                obj = "chat.completion.chunk"
            else:
                choice = {"index": 0, "text": word + " "}
                obj = "text_completion"
            chunk = {"id": ident, "object": obj, "model": MODEL, "choices": [choice]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


EngineFactory = Callable[..., EngineEmulator]
"""The `engine` fixture: `engine(role, name, **fields)` starts one, stopped after the test."""

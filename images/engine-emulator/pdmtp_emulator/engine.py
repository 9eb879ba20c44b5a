"""An emulated vLLM engine: the slice of vLLM's OpenAI server (and, for a prefill, the Mooncake
bootstrap server and transfer worker) that vllm-router and a decode touch.

Each engine runs its aiohttp apps in a private event loop on a daemon thread, so sync tests can
start, reconfigure and inspect it; `serve.py` runs the same engine as a pod's main process. It
records every request it receives and can be told to fail (HTTP status, dropped connection, or a
delay).

The bootstrap `GET /query` body follows vLLM 0.33.0's `MooncakeBootstrapServer`: a map from the
data-parallel rank to `{engine_id, worker_addr: {tp_rank: {pp_rank: "host:port"}}}` (JSON keys are
strings). vLLM mints a fresh uuid4 engine_id each time an engine starts; `restart()` mimics that.

KV transfer (opt-in, `pull_kv=True` on the decode): a prefill asked with
`kv_transfer_params.do_remote_decode` keeps a record of "its KV" under the request's
`transfer_id` (who computed it: pod, revision, engine_id, speculative tokens). A decode asked with
`do_remote_prefill` does what vLLM's Mooncake decoder does to find that KV: it asks
`remote_bootstrap_addr`'s `/query` for the rank whose engine_id is `remote_engine_id`, then pulls
the transfer from that rank's worker address. Any mismatch (no such engine id, no such transfer)
fails the request with a 500, as a failed KV load does under vLLM's default
`kv_load_failure_policy` fail (under recompute the decode computes the prompt itself and answers
without provenance), and the decode answers with the provenance of the KV it used, so a client can
tell which prefill, of which revision, fed it.

Load (scheduler.py): a generation request queues for one of the engine's `max_running` slots,
then computes its first token (a prefill, or one step after a remote prefill) and decodes the
rest of its max_tokens in steps that, with MTP, emit the accepted draft tokens too. `/metrics`
serves the gauges, histograms and spec-decode counters that this produces, in vLLM 0.33.0's
names. `GET /emulator/config` shows the knobs (`Tuning`), `POST /emulator/config` with a JSON
object of some of them changes them while the engine serves (`configure` in-process); the pod's
env sets them at start (`PDMTP_EMULATOR_*`, see serve.py).

A multi-node leader (ranks.py) moves `state`: "starting" until its headless ranks have joined,
then "serving", "dead" once one is lost; anything but "serving" fails /health and generation.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import aiohttp
from aiohttp import web

from pdmtp_emulator.handoff import HandoffCounts, LoadFailurePolicy, prompt_tokens
from pdmtp_emulator.ranks import EngineState
from pdmtp_emulator.scheduler import (
    Scheduler,
    Tuning,
    label_set,
    max_tokens_of,
    request_class,
)

Role = Literal["prefill", "decode"]
FailMode = Literal["status", "drop", "slow"]
LOOPBACK = "127.0.0.1"
MODEL = "emulated/model"
# Paths the failure switch applies to; health and model listing keep answering so the router
# keeps the engine in rotation, as a real engine whose generation fails would.
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")
# A prefill keeps at most this many untaken transfers, each for at most KV_TTL seconds (vLLM
# frees unpulled KV after VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT); a decode remembers this many.
KV_CAPACITY = 10_000
KV_TTL = 120.0
DECODE_RECORDS = 100_000


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


@dataclass(frozen=True)
class Identity:
    """Who an engine is, for provenance: its pod, its PDDeployment revision, its MTP k."""

    pod: str = ""
    revision: str = ""
    speculative_tokens: int | None = None
    prefill_backoff: int | None = None
    """The backoff the operator derived for this engine (`PDMTP_EXPECTED_PREFILL_BACKOFF`)."""


@dataclass(frozen=True)
class KVRecord:
    """The KV a prefill computed for one transfer, as a decode receives it."""

    transfer_id: str
    engine_id: str
    prefill: Identity
    prompt: str


@dataclass(frozen=True)
class DecodeRecord:
    """What one decode request used: the transfer's KV and the engine it was pulled from."""

    transfer_id: str
    decode: Identity
    prefill: Identity
    remote_engine_id: str
    bootstrap_addr: str
    worker_addr: str

    @property
    def same_revision(self) -> bool:
        return self.decode.revision == self.prefill.revision


class KVPullError(RuntimeError):
    """The decode could not get the KV its request names (as vLLM's failed KV load)."""


@dataclass
class EngineEmulator:
    role: Role
    name: str
    host: str = LOOPBACK
    http_port: int = 0
    bootstrap_port: int = 0
    worker_port: int = 0
    """A prefill's transfer worker (Mooncake's per-rank RPC endpoint); 0 picks a free port."""
    advertise_host: str | None = None
    """The address `/query` tells decodes to dial (a pod's IP); defaults to `host`."""
    dp_ranks: int = 1
    identity: Identity = field(default_factory=Identity)
    pull_kv: bool = False
    """Decode: fetch each request's KV from its prefill (off in the router tier, where some tests
    deliberately hand the decode stale engine ids and look only at what the router sent)."""
    engine_ids: list[str] = field(default_factory=list)
    requests: list[Recorded] = field(default_factory=list)
    decodes: deque[DecodeRecord] = field(default_factory=lambda: deque(maxlen=DECODE_RECORDS))
    bootstrap_queries: int = 0
    failure: Failure | None = None
    query_status: int = 200
    """What the bootstrap `/query` answers; anything but 200 comes with an error body."""
    record_requests: bool = True
    """Keep every request in `requests` (a pod serving thousands of requests turns this off)."""
    shutdown_timeout: float = 60.0
    """On shutdown, stop listening and give requests in flight this long (vLLM's
    --shutdown-timeout)."""
    metrics_port: int | None = None
    """A metrics-only listener (GET /metrics, nothing else), as the engine image's launcher
    serves on PDMTP_METRICS_PORT; None: only the API port's /metrics, as vLLM alone."""
    tuning: Tuning = field(default_factory=Tuning)
    """Capacity, step times and MTP acceptance; change them with `configure`."""
    load_failure_policy: LoadFailurePolicy = "fail"
    """Decode: what a failed KV pull does to its request (`--kv-transfer-config`'s
    kv_load_failure_policy, vLLM's default fail): fail it with a 500, or recompute the prompt."""
    state: EngineState = "serving"
    """Set by a multi-node leader's rendezvous (ranks.py): "starting" until every rank has
    joined (/health 503, generation 503), "dead" once one is lost (/health 503 as vLLM's on
    EngineDeadError, generation 500, including requests that were running)."""
    generation_count: int = 0
    scheduler: Scheduler = field(init=False)
    handoff: HandoffCounts = field(init=False)
    """A decode's hand-off counts and faults (handoff.py)."""

    _kv: OrderedDict[str, tuple[float, KVRecord]] = field(default_factory=OrderedDict)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runners: list[web.AppRunner] = field(default_factory=list)
    _session: aiohttp.ClientSession | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.scheduler = Scheduler(self.tuning, self.identity.speculative_tokens)
        self.handoff = HandoffCounts(
            self.identity.speculative_tokens, self.identity.prefill_backoff
        )

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> EngineEmulator:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"emulator-{self.name}", daemon=True
        )
        self._thread.start()
        self._call(self.serve())
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        self._call(self.shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._loop.close()
        self._loop = None

    def restart(self) -> None:
        """Stop and serve again on the same ports with new engine ids and metrics from zero,
        like a restarted vLLM."""
        self._call(self.shutdown())
        self.engine_ids = []
        self.scheduler = Scheduler(self.tuning, self.identity.speculative_tokens)
        self.handoff = HandoffCounts(
            self.identity.speculative_tokens, self.identity.prefill_backoff
        )
        self._call(self.serve())

    def __enter__(self) -> EngineEmulator:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    # ---- inspection and control ------------------------------------------------------------

    @staticmethod
    def _authority(host: str) -> str:
        return f"[{host}]" if ":" in host else host

    @property
    def url(self) -> str:
        return f"http://{self._authority(self.host)}:{self.http_port}"

    @property
    def bootstrap_addr(self) -> str:
        return f"http://{self._authority(self.host)}:{self.bootstrap_port}"

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

    @property
    def running(self) -> int:
        return self.scheduler.running

    @property
    def waiting(self) -> int:
        return self.scheduler.waiting

    def configure(self, **changes: Any) -> Tuning:
        """Change the knobs while serving (as `POST /emulator/config`); ValueError if invalid."""
        tuning = self.tuning.updated(changes)
        if self._loop is None:
            self._apply(tuning)
        else:
            loop = self._loop

            async def apply() -> None:
                self._apply(tuning)

            asyncio.run_coroutine_threadsafe(apply(), loop).result(timeout=10)
        return tuning

    def _apply(self, tuning: Tuning) -> None:
        self.tuning = tuning
        self.scheduler.configure(tuning)

    # ---- serving (also the pod's main coroutine, see serve.py) -----------------------------

    def _call(self, coro: Coroutine[Any, Any, None]) -> None:
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    async def serve(self) -> None:
        """Listen: the OpenAI app, and for a prefill the bootstrap server and transfer worker."""
        if not self.engine_ids:
            self.engine_ids = [str(uuid.uuid4()) for _ in range(self.dp_ranks)]
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_get("/pdmtp/identity", self._identity)
        app.router.add_get("/pdmtp/decodes", self._decodes)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/emulator/config", self._get_config)
        app.router.add_post("/emulator/config", self._post_config)
        # Anything else the router might probe is recorded and answered 404, so a test sees it.
        app.router.add_route("*", "/{tail:.*}", self._unknown)
        self.http_port = await self._listen(app, self.http_port)
        if self.role == "prefill":
            boot = web.Application()
            boot.router.add_get("/query", self._query)
            self.bootstrap_port = await self._listen(boot, self.bootstrap_port)
            worker = web.Application()
            worker.router.add_get("/kv/{transfer_id}", self._pull)
            self.worker_port = await self._listen(worker, self.worker_port)
        if self.metrics_port is not None:
            # Any other path or method is aiohttp's 404/405: this port serves metrics only.
            metrics = web.Application()
            metrics.router.add_get("/metrics", self._metrics)
            self.metrics_port = await self._listen(metrics, self.metrics_port)

    async def _listen(self, app: web.Application, port: int) -> int:
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=self.shutdown_timeout)
        await runner.setup()
        site = web.TCPSite(runner, self.host, port, reuse_address=True)
        await site.start()
        self._runners.append(runner)
        return int(runner.addresses[0][1])

    async def shutdown(self) -> None:
        runners, self._runners = self._runners, []
        for runner in runners:
            await runner.cleanup()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _record(self, request: web.Request) -> Recorded:
        raw = await request.read()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        rec = Recorded(request.method, request.path, dict(request.headers), body, time.monotonic())
        if self.record_requests:
            with self._lock:
                self.requests.append(rec)
        return rec

    async def _health(self, request: web.Request) -> web.StreamResponse:
        await self._record(request)
        if self.state != "serving":
            return web.Response(status=503, text=f"engine {self.state}")
        return web.Response(status=200)

    def _not_serving(self) -> web.Response | None:
        """The answer to a generation request while the engine cannot run it."""
        if self.state == "serving":
            return None
        status = 500 if self.state == "dead" else 503
        error = {"object": "error", "message": f"{self.name}: engine {self.state}", "code": status}
        return web.json_response(error, status=status)

    async def _models(self, request: web.Request) -> web.StreamResponse:
        await self._record(request)
        card = {"id": MODEL, "object": "model", "created": 0, "owned_by": "vllm"}
        return web.json_response({"object": "list", "data": [card]})

    async def _identity(self, request: web.Request) -> web.StreamResponse:
        body = {"role": self.role, "engine_ids": self.engine_ids, **asdict(self.identity)}
        return web.json_response(body)

    async def _decodes(self, request: web.Request) -> web.StreamResponse:
        with self._lock:
            records = [asdict(r) for r in self.decodes]
        return web.json_response(records)

    async def _unknown(self, request: web.Request) -> web.StreamResponse:
        await self._record(request)
        return web.json_response({"error": "not emulated"}, status=404)

    async def _query(self, request: web.Request) -> web.StreamResponse:
        self.bootstrap_queries += 1
        if self.query_status != 200:
            return web.json_response({"detail": "not ready"}, status=self.query_status)
        host = self._authority(self.advertise_host or self.host)
        body = {
            str(rank): {
                "engine_id": engine_id,
                # The transfer worker of this rank: a decode dials it, the router never does.
                "worker_addr": {"0": {"0": f"{host}:{self.worker_port}"}},
            }
            for rank, engine_id in enumerate(self.engine_ids)
        }
        return web.json_response(body)

    async def _pull(self, request: web.Request) -> web.StreamResponse:
        """Hand a transfer's KV to the decode that names it, once (as Mooncake frees it)."""
        now = time.monotonic()
        with self._lock:
            entry = self._kv.pop(request.match_info["transfer_id"], None)
        if entry is None or now - entry[0] > KV_TTL:
            return web.json_response({"error": "unknown transfer"}, status=404)
        return web.json_response(asdict(entry[1]))

    def _keep_kv(self, record: KVRecord) -> None:
        now = time.monotonic()
        with self._lock:
            self._kv[record.transfer_id] = (now, record)
            while len(self._kv) > KV_CAPACITY or (
                self._kv and now - next(iter(self._kv.values()))[0] > KV_TTL
            ):
                self._kv.popitem(last=False)

    async def _fetch_json(self, url: str) -> Any:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        async with self._session.get(url) as resp:
            if resp.status != 200:
                raise KVPullError(f"GET {url}: HTTP {resp.status}")
            return await resp.json()

    async def _pull_kv(self, params: dict[str, Any]) -> DecodeRecord:
        """The decode's side of a transfer: find the prefill engine, then pull the KV from it."""
        missing = [
            k
            for k in ("transfer_id", "remote_bootstrap_addr", "remote_engine_id")
            if not params.get(k)
        ]
        if missing:
            raise KVPullError(f"kv_transfer_params without {', '.join(missing)}")
        bootstrap = str(params["remote_bootstrap_addr"]).rstrip("/")
        ranks = await self._fetch_json(f"{bootstrap}/query")
        worker = next(
            (
                r["worker_addr"]["0"]["0"]
                for r in ranks.values()
                if r.get("engine_id") == params["remote_engine_id"]
            ),
            None,
        )
        if worker is None:
            raise KVPullError(f"{bootstrap} serves no engine {params['remote_engine_id']}")
        kv = await self._fetch_json(f"http://{worker}/kv/{params['transfer_id']}")
        if kv.get("engine_id") != params["remote_engine_id"]:
            raise KVPullError(f"transfer from engine {kv.get('engine_id')}, not the one named")
        return DecodeRecord(
            transfer_id=str(params["transfer_id"]),
            decode=self.identity,
            prefill=Identity(**kv["prefill"]),
            remote_engine_id=str(params["remote_engine_id"]),
            bootstrap_addr=bootstrap,
            worker_addr=worker,
        )

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        """vLLM's scaling metrics from this engine's real load (scheduler.py), in the Prometheus
        text format, with vLLM's `model_name` and `engine` labels."""
        labels = {"model_name": MODEL, "engine": "0"}
        lines = self.scheduler.metric_lines(labels)
        if self.role == "decode":
            lines += self.handoff.metric_lines(self.tuning, labels)
        lines += [
            "# HELP pdmtp_emulator_generation_requests_total Generation requests received.",
            "# TYPE pdmtp_emulator_generation_requests_total counter",
            f"pdmtp_emulator_generation_requests_total{label_set(labels)} {self.generation_count}",
        ]
        return web.Response(
            text="\n".join(lines) + "\n", content_type="text/plain", charset="utf-8"
        )

    def _config_body(self) -> dict[str, Any]:
        return {
            **self.tuning.as_dict(),
            "speculative_tokens": self.scheduler.k,
            "running": self.scheduler.running,
            "waiting": self.scheduler.waiting,
        }

    async def _get_config(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self._config_body())

    async def _post_config(self, request: web.Request) -> web.StreamResponse:
        """Change some knobs at once (all or none): `{"acceptance_rate": 0.3}`; 400 if invalid."""
        try:
            changes = await request.json()
            if not isinstance(changes, dict):
                raise ValueError("the body must be a JSON object of settings")
            tuning = self.tuning.updated(changes)
        except ValueError as exc:  # json.JSONDecodeError is one
            return web.json_response({"error": str(exc)}, status=400)
        self._apply(tuning)
        return web.json_response(self._config_body())

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        self.generation_count += 1
        refused = self._not_serving()
        if refused is not None:
            await self._record(request)
            return refused
        return await self._answer(request)

    async def _answer(self, request: web.Request) -> web.StreamResponse:
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
        params = body.get("kv_transfer_params") or {}
        chat = request.path == "/v1/chat/completions"
        text = self.output_text()
        remote_prefill = self.role == "decode" and bool(params.get("do_remote_prefill"))
        if self.role == "prefill" and params.get("do_remote_decode") and params.get("transfer_id"):
            # Kept on arrival, not once computed: a decode that asks early finds it (a Mooncake
            # decoder waits for its KV; this stand-in has nothing to wait on).
            prompt = json.dumps(body.get("messages") if chat else body.get("prompt"))
            self._keep_kv(
                KVRecord(str(params["transfer_id"]), self.engine_id, self.identity, prompt)
            )
        max_tokens = max_tokens_of(body)
        asked = body.get("messages") if chat else body.get("prompt")
        prompt = prompt_tokens(asked)
        fault = self.handoff.fault(self.tuning) if remote_prefill else None
        if self.role == "decode" and (not remote_prefill or fault == "decode_only"):
            self.handoff.decode_only()
            remote_prefill = False
        elif remote_prefill:
            self.handoff.pulled(
                self.tuning, prompt
            )  # counted when it starts, as the connector does
        async with self.scheduler.admit(request_class(json.dumps(asked))) as run:
            failure: str | None = "the pull failed" if fault == "fail" else None
            if remote_prefill and self.pull_kv and failure is None:
                try:
                    used = await self._pull_kv(params)
                except (TimeoutError, KVPullError, aiohttp.ClientError, KeyError) as exc:
                    failure = str(exc)
                else:
                    with self._lock:
                        self.decodes.append(used)
                    text = json.dumps({"kv": asdict(used)}, sort_keys=True)
            if failure is not None:
                self.handoff.failed()
                if self.load_failure_policy == "fail":
                    message = f"KV load failed ({failure}): kv_load_failure_policy fail"
                    error = {"object": "error", "message": message, "code": 500}
                    return web.json_response(error, status=500)
                remote_prefill = False  # recomputed here: an answer without the prefill's KV
            await run.first_token(prefilled_elsewhere=remote_prefill)
            await run.decode(max_tokens)
        died = self._not_serving()  # the engine died under this request (a rank was lost)
        if died is not None:
            return died
        if body.get("stream"):
            return await self._stream(request, chat, text)
        return web.json_response(self._completion(chat, text, body, run.tokens))

    def output_text(self) -> str:
        """What this engine generates: names the engine, so a test can tell who answered."""
        return f"from {self.name}"

    def _completion(
        self, chat: bool, text: str, body: dict[str, Any], tokens: int
    ) -> dict[str, Any]:
        created = int(time.time())
        usage = {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": 3 + tokens}
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

"""The tier's engines: started together, kept while useful, at most `max_alive` at a time.

Each engine takes about a minute of the machine's two cores to start and ~4 GB to run, so the
tier starts each one once and lets later tests reuse it (the stock-decode test reuses the fixed
k=3 prefill): a released engine keeps running until room is needed or the session ends.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acceptance import Drafting, drafting
from loopback import free_ports
from processes import (
    Engine,
    ManagedProcess,
    Router,
    http,
    metric_by,
    prometheus_samples,
    prompt_tokens_by_source,
    start_engine,
)
from wiring import EngineWiring, router_wiring


@dataclass(frozen=True)
class Launch:
    """How to start one engine: `command` is the launcher's (the product's) or `vllm serve`."""

    name: str
    command: tuple[str, ...]
    pod_env: Mapping[str, str]
    url: str
    host_env: Mapping[str, str] = field(default_factory=dict)
    """What this host needs and a pod would not (see processes.CPU_HOST_ENV)."""


@dataclass
class Figures:
    """What the tier measured, for docs/benchmarks.md (written to PDMTP_PD_CPU_RESULT)."""

    engine_ready_seconds: dict[str, float] = field(default_factory=dict)
    engine_rss_mib: dict[str, float] = field(default_factory=dict)
    request_seconds: dict[str, list[float]] = field(default_factory=dict)
    transfer_ms: dict[str, list[float]] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "engine_ready_seconds": self.engine_ready_seconds,
            "engine_rss_mib": self.engine_rss_mib,
            "request_seconds": self.request_seconds,
            "transfer_ms": self.transfer_ms,
            **self.notes,
        }

    def note_rss(self, name: str, engine: Engine) -> None:
        mib = engine.process.rss_bytes() / 2**20
        self.engine_rss_mib[name] = round(max(mib, self.engine_rss_mib.get(name, 0.0)), 1)


class Fleet:
    def __init__(self, workdir: Path, figures: Figures, max_alive: int = 3) -> None:
        self.workdir = workdir
        self.figures = figures
        self.max_alive = max_alive
        self._alive: dict[str, Engine] = {}
        self._in_use: set[str] = set()
        self._last_used: dict[str, float] = {}

    def acquire(self, launches: Sequence[Launch]) -> list[Engine]:
        """The engines, started if not running (all in parallel), marked in use."""
        wanted = {launch.name for launch in launches}
        missing = [launch for launch in launches if launch.name not in self._alive]
        self._make_room(len(missing), keep=wanted)
        # Start them all before waiting for any: startups overlap. From this thread only: the
        # children's parent-death signal follows the thread that started them.
        for launch in missing:
            self._alive[launch.name] = start_engine(
                launch.name,
                launch.command,
                launch.pod_env,
                launch.url,
                self.workdir,
                host_env=launch.host_env,
            )
        for launch in missing:
            engine = self._alive[launch.name]
            self.figures.engine_ready_seconds[launch.name] = round(engine.wait_ready(), 1)
            self.figures.note_rss(launch.name, engine)
        self._in_use |= wanted
        return [self._alive[launch.name] for launch in launches]

    def release(self, names: Sequence[str]) -> None:
        for name in names:
            self._in_use.discard(name)
            self._last_used[name] = time.monotonic()

    def stop(self, name: str) -> None:
        engine = self._alive.pop(name, None)
        self._in_use.discard(name)
        if engine is not None:
            self.figures.note_rss(name, engine)
            engine.process.stop()

    def make_room(self, count: int, keep: Sequence[str] = ()) -> None:
        """Stop idle engines until `count` more fit: for engine processes started outside the
        fleet (the ranks of a multi-node group), each of which takes an engine's room."""
        self._make_room(count, keep=set(keep))

    def _make_room(self, count: int, keep: set[str]) -> None:
        idle = sorted(
            (name for name in self._alive if name not in self._in_use and name not in keep),
            key=lambda name: self._last_used.get(name, 0.0),
        )
        while len(self._alive) + count > self.max_alive and idle:
            self.stop(idle.pop(0))
        if len(self._alive) + count > self.max_alive:
            raise RuntimeError(
                f"fleet full: {sorted(self._alive)} alive, {sorted(self._in_use)} in use"
            )

    def close(self) -> None:
        for name in list(self._alive):
            self.stop(name)


def start_router(prefill: EngineWiring, decode: EngineWiring, workdir: Path, name: str) -> Router:
    """The real vllm-router 0.1.17 in front of one prefill and one decode, as the operator runs
    it per revision (its arguments from the operator's renderer)."""
    port, metrics_port = free_ports(2)
    wiring = router_wiring(prefill, decode, port=port, metrics_port=metrics_port)
    process = ManagedProcess(
        name=name,
        command=[str(wiring.binary), *wiring.args],
        env={"PATH": "/usr/bin:/bin", "RUST_LOG": "info"},
        log_path=workdir / f"{name}.log",
    ).start()
    router = Router(process=process, port=port)
    router.wait_ready()
    return router


@dataclass(frozen=True)
class Prompt:
    name: str
    token_ids: tuple[int, ...]


def fresh_prompts(tag: str, lengths: Sequence[int], vocab: int) -> list[Prompt]:
    """Prompts of `lengths` tokens drawn from [0, vocab) that no other `tag` gets.

    Each measurement of acceptance takes prompts of its own: a prompt an engine computed before
    is partly served from its prefix cache, whose blocks carry drafter KV written for the
    earlier request.
    """
    rng = random.Random(f"pd-cpu prompts {tag}")
    return [Prompt(f"len{n}", tuple(rng.randrange(vocab) for _ in range(n))) for n in lengths]


@dataclass(frozen=True)
class Completion:
    status: int
    token_ids: tuple[int, ...] | None
    text: str | None
    error: str | None
    seconds: float


@dataclass(frozen=True)
class Accounting:
    """Per request, the change in vLLM's `vllm:prompt_tokens_by_source_total` on each side."""

    prefill: Mapping[str, float]
    decode: Mapping[str, float]


@dataclass(frozen=True)
class Scrape:
    """An engine's /metrics answer and when it was taken (time.monotonic())."""

    at: float
    text: str


@dataclass(frozen=True)
class Served:
    prompt: Prompt
    completion: Completion
    accounting: Accounting | None
    drafting: Drafting | None = None
    """What the drafting engine (a pair's decode) counted over this request."""
    scrape: Scrape | None = None
    """The drafting engine's /metrics right after this request."""


def completion_body(model: Path, prompt: Prompt, max_tokens: int) -> dict[str, Any]:
    """Greedy, a fixed length whatever the random model samples, token ids in the answer."""
    return {
        "model": str(model),
        "prompt": list(prompt.token_ids),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
    }


def complete(url: str, body: Mapping[str, Any], timeout: float = 300.0) -> Completion:
    started = time.monotonic()
    status, raw = http("POST", url + "/v1/completions", body, timeout=timeout)
    seconds = time.monotonic() - started
    if status != 200:
        return Completion(status, None, None, raw.decode(errors="replace")[:500], seconds)
    choice = json.loads(raw)["choices"][0]
    ids = choice.get("token_ids")
    return Completion(status, None if ids is None else tuple(ids), choice["text"], None, seconds)


def _delta(after: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    return {source: after[source] - before.get(source, 0.0) for source in after}


def serve_all(
    url: str,
    model: Path,
    prompts: Sequence[Prompt],
    max_tokens: int,
    *,
    prefill: Engine | None = None,
    decode: Engine | None = None,
    drafter: Engine | None = None,
) -> list[Served]:
    """One request per prompt, in turn, each measured on both engines' counters when given, and
    on the drafting engine's (`drafter`, else `decode`) MTP counters when there is one.

    Sequential on purpose: the counters are engine-wide, so only one request may be in flight
    for a difference of two scrapes to belong to it.
    """
    drafter = drafter or decode
    served = []
    for prompt in prompts:
        before = _scrapes(prefill, decode, drafter)
        completion = complete(url, completion_body(model, prompt, max_tokens))
        after = _scrapes(prefill, decode, drafter)
        accounting = None
        if prefill is not None and decode is not None:
            accounting = Accounting(
                prefill=_delta(after["prefill"], before["prefill"]),
                decode=_delta(after["decode"], before["decode"]),
            )
        drafted = scrape = None
        if drafter is not None:
            drafted = drafting(after["drafter"]).since(drafting(before["drafter"]))
            scrape = after["drafter_scrape"]
        served.append(Served(prompt, completion, accounting, drafted, scrape))
    return served


def _scrapes(
    prefill: Engine | None, decode: Engine | None, drafter: Engine | None
) -> dict[str, Any]:
    """One scrape per engine (a drafter that is the decode scraped once)."""
    texts: dict[int, Scrape] = {}
    for engine in (prefill, decode, drafter):
        if engine is not None and id(engine) not in texts:
            texts[id(engine)] = Scrape(time.monotonic(), engine.metrics_text())
    got: dict[str, Any] = {}
    if prefill is not None and decode is not None:
        got["prefill"] = prompt_tokens_by_source(prometheus_samples(texts[id(prefill)].text))
        got["decode"] = prompt_tokens_by_source(prometheus_samples(texts[id(decode)].text))
    if drafter is not None:
        got["drafter_scrape"] = texts[id(drafter)]
        got["drafter"] = prometheus_samples(texts[id(drafter)].text)
    return got


def drafting_of(served: Sequence[Served]) -> Drafting:
    """The drafting over `served`, summed over its requests."""
    total = Drafting()
    for one in served:
        assert one.drafting is not None, "served without a drafting engine"
        total = total.plus(one.drafting)
    return total


_SENT = re.compile(r"Sending to \S+ done, took ([0-9.e-]+)")


def transfer_durations_ms(prefill: Engine) -> list[float]:
    """Every KV push the prefill's Mooncake worker logged, in milliseconds."""
    text = prefill.process.log_path.read_text(errors="replace")
    return [round(float(match) * 1000, 3) for match in _SENT.findall(text)]


HANDOFF_SERIES = (
    # The fixed connector's hand-off counts (pdmtp_engine.handoff), on the decode.
    "pdmtp:kv_pulled_requests_total",
    "pdmtp:kv_pulled_tokens_total",
    "pdmtp:kv_backoff_tokens_total",
    "pdmtp:kv_refreshed_tokens_total",
    "pdmtp:kv_decode_only_requests_total",
    # vLLM's own: failed receives (Mooncake) and MTP drafting.
    "vllm:mooncake_num_failed_recvs_total",
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
)


def handoff_counts(engine: Engine) -> dict[str, float]:
    """HANDOFF_SERIES as `engine` exports them (summed over ranks); absent ones left out."""
    samples = engine.metrics()
    return {
        name: sum(found.values()) for name in HANDOFF_SERIES if (found := metric_by(samples, name))
    }


def counts_since(after: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    return {name: after[name] - before.get(name, 0.0) for name in after}

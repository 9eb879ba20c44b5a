"""The emulated engine's scheduler: how many requests it runs at once, how long their prefill and
decode steps take, how many MTP draft tokens a step accepts, and the vLLM 0.33.0 metrics that
follow from all that.

It exists so that an engine's metrics are caused by the load it really carries, and an autoscaler
can be proven end to end against emulated engines: a request beyond the engine's capacity waits
(`vllm:num_requests_waiting`), holds a slot while it runs (`vllm:num_requests_running`,
`vllm:kv_cache_usage_perc`), and its timings fill the TTFT, inter-token latency and queue time
histograms. With MTP (k speculative tokens) each decode step verifies k draft tokens and accepts
some; the step emits 1 + accepted tokens, so a lower acceptance takes more steps per request, each
request holds its slot longer, and at the same request rate more requests run and wait, as on a
real engine.

Real traffic mixes requests that draft well (code, structured output) with requests that draft
poorly (open chat): a request whose prompt names a class (`[class=NAME]`, which the load client
writes) accepts at that class's rate (`class_acceptance`), any other at `acceptance_rate`.

What it is not: a model of vLLM's scheduler. Time is wall-clock sleeping; a step gets slower as the
batch fills (`batch_slowdown`), nothing else competes; the acceptance is a deterministic rate per
class, not a random draw, so a test can measure it; KV usage is running / capacity, not tokens /
blocks.
Everything here runs on the engine's event loop; nothing in it is thread-safe.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

DEFAULT_MAX_TOKENS = 16
"""Output tokens of a request that names no max_tokens."""
MAX_TOKENS_CAP = 4096
"""Longest generation emulated, so a stray request cannot hold a slot for minutes."""
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    math.inf,
)
"""Upper bounds (seconds) of every latency histogram's buckets."""

ENV = {
    "max_running": "PDMTP_EMULATOR_MAX_RUNNING",
    "acceptance_rate": "PDMTP_EMULATOR_ACCEPTANCE_RATE",
    "step_seconds": "PDMTP_EMULATOR_STEP_SECONDS",
    "prefill_seconds": "PDMTP_EMULATOR_PREFILL_SECONDS",
    "batch_slowdown": "PDMTP_EMULATOR_BATCH_SLOWDOWN",
    "pull_failure_rate": "PDMTP_EMULATOR_PULL_FAILURE_RATE",
    "decode_only_rate": "PDMTP_EMULATOR_DECODE_ONLY_RATE",
    "fixed_connector": "PDMTP_EMULATOR_FIXED_CONNECTOR",
    "class_acceptance": "PDMTP_EMULATOR_CLASS_ACCEPTANCE",
}
"""The environment variable that sets each `Tuning` field's value at start."""
INTEGER_FIELDS = ("max_running", "fixed_connector")
CLASS_PATTERN = re.compile(r"\[class=([A-Za-z0-9_.-]+)\]")
"""How a prompt names its request class."""


def request_class(prompt: str) -> str | None:
    """The class a prompt names (`[class=NAME]` anywhere in it), or None."""
    found = CLASS_PATTERN.search(prompt)
    return found.group(1) if found else None


def parse_classes(text: str) -> tuple[tuple[str, float], ...]:
    """`code=0.85,chat=0.55` -> the classes' acceptance, by name (ValueError if malformed)."""
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, rate = item.partition("=")
        if not sep or not CLASS_PATTERN.fullmatch(f"[class={name.strip()}]"):
            raise ValueError(f"a request class is NAME=RATE, got {item!r}")
        out[name.strip()] = float(rate)
    return tuple(sorted(out.items()))


@dataclass(frozen=True)
class Tuning:
    """The knobs of the emulated engine's speed; the pod's env sets them, the admin endpoint
    (`POST /emulator/config`) changes them while it serves."""

    max_running: int = 8
    """Requests run at once (the batch); more wait in a FIFO queue."""
    acceptance_rate: float = 0.7
    """Fraction of MTP draft tokens accepted (accepted / draft tokens), 0..1."""
    step_seconds: float = 0.005
    """One decode step of a lone request; the first token after a remote prefill takes one."""
    prefill_seconds: float = 0.005
    """Computing a prompt's KV here, up to its first token."""
    batch_slowdown: float = 0.5
    """A step of a full batch takes (1 + this) times `step_seconds`; linear in between."""
    pull_failure_rate: float = 0.0
    """Decode: fraction of KV pulls that fail and are recomputed here (handoff.py), 0..1."""
    decode_only_rate: float = 0.0
    """Decode: fraction of remote-prefill requests served with no prefill's KV, 0..1."""
    fixed_connector: int = 1
    """0: an engine without the fixed connector (no hand-off counts, no backoff)."""
    class_acceptance: tuple[tuple[str, float], ...] = ()
    """Per request class, its fraction of draft tokens accepted (a request names its class in
    its prompt, `[class=NAME]`); a request of no listed class takes acceptance_rate. From the
    env as `code=0.85,chat=0.55`, over the admin endpoint as a JSON object."""

    def __post_init__(self) -> None:
        for name in INTEGER_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if self.max_running < 1:
            raise ValueError(f"max_running must be at least 1, got {self.max_running}")
        if self.fixed_connector not in (0, 1):
            raise ValueError(f"fixed_connector must be 0 or 1, got {self.fixed_connector}")
        for name in (
            "acceptance_rate",
            "step_seconds",
            "prefill_seconds",
            "batch_slowdown",
            "pull_failure_rate",
            "decode_only_rate",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        for name in ("acceptance_rate", "pull_failure_rate", "decode_only_rate"):
            if getattr(self, name) > 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        for name, rate in self.class_acceptance:
            if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= 1:
                raise ValueError(f"class {name}'s acceptance must be in [0, 1], got {rate!r}")

    def acceptance_of(self, request_class: str | None) -> float:
        """The fraction of draft tokens a request of this class accepts."""
        return dict(self.class_acceptance).get(request_class or "", self.acceptance_rate)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Tuning:
        """The defaults, with each field whose variable (`ENV`) is set taken from it."""
        changes: dict[str, Any] = {}
        for name, var in ENV.items():
            raw = env.get(var, "").strip()
            if not raw:
                continue
            if name == "class_acceptance":
                changes[name] = parse_classes(raw)
                continue
            try:
                changes[name] = int(raw) if name in INTEGER_FIELDS else float(raw)
            except ValueError:
                raise ValueError(f"{var}={raw!r} is not a number") from None
        return cls().updated(changes)

    def updated(self, changes: Mapping[str, Any]) -> Tuning:
        """These knobs with `changes` applied; ValueError names an unknown or invalid one."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ValueError(f"unknown setting(s) {unknown}; known: {sorted(known)}")
        values = dict(changes)
        # JSON has one number type: 4.0 is an acceptable capacity, 4.5 is not.
        for name in INTEGER_FIELDS:
            number = values.get(name)
            if isinstance(number, float) and number.is_integer():
                values[name] = int(number)
        classes = values.get("class_acceptance")
        if isinstance(classes, Mapping):
            values["class_acceptance"] = tuple(sorted(classes.items()))
        elif isinstance(classes, str):
            values["class_acceptance"] = parse_classes(classes)
        elif classes is not None and not isinstance(classes, tuple):
            raise ValueError(f"class_acceptance must be an object of rates, got {classes!r}")
        return replace(self, **values)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "class_acceptance": dict(self.class_acceptance)}


@dataclass
class Histogram:
    """A Prometheus histogram: per-bucket counts, the sum and the count of its observations."""

    name: str
    help: str
    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] | None = None
    sum: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        if self.counts is None:
            self.counts = [0] * len(self.buckets)
        for index, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[index] += 1
                break
        self.sum += value
        self.count += 1

    def lines(self, labels: Mapping[str, str]) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        cumulative = 0
        counts = self.counts or [0] * len(self.buckets)
        for bound, count in zip(self.buckets, counts, strict=True):
            cumulative += count
            le = "+Inf" if math.isinf(bound) else repr(float(bound))
            out.append(f"{self.name}_bucket{label_set({**labels, 'le': le})} {float(cumulative)}")
        out.append(f"{self.name}_count{label_set(labels)} {float(self.count)}")
        out.append(f"{self.name}_sum{label_set(labels)} {float(self.sum)}")
        return out


def label_set(labels: Mapping[str, str]) -> str:
    """`{name="value",...}`, values escaped as the text format wants."""

    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

    return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in labels.items()) + "}"


class Slots:
    """The batch: at most `capacity` holders; the rest wait first come, first served.

    The capacity may change at any time; lowering it lets the holders finish, raising it lets
    waiters in at once."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return sum(1 for waiter in self._waiters if not waiter.done())

    async def acquire(self) -> None:
        if self.running < self.capacity and not self._waiters:
            self.running += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # let in, then cancelled before it could run: give it back
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        self.running -= 1
        self._let_in()

    def resize(self, capacity: int) -> None:
        self.capacity = capacity
        self._let_in()

    def _let_in(self) -> None:
        while self._waiters and self.running < self.capacity:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.running += 1
                waiter.set_result(None)


class Scheduler:
    """One engine's queue, batch, step clock, MTP acceptance and metrics."""

    def __init__(
        self,
        tuning: Tuning,
        speculative_tokens: int | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tuning = tuning
        self.k = max(0, speculative_tokens or 0)
        """Draft tokens per step (MTP's num_speculative_tokens); 0 without speculative decoding."""
        self.clock = clock
        self.slots = Slots(tuning.max_running)
        self.time_to_first_token = Histogram(
            "vllm:time_to_first_token_seconds",
            "Seconds from a request's arrival to its first output token.",
        )
        self.inter_token_latency = Histogram(
            "vllm:inter_token_latency_seconds",
            "Seconds between two successive token outputs of a request (one per step).",
        )
        self.queue_time = Histogram(
            "vllm:request_queue_time_seconds",
            "Seconds a request waited before it was scheduled.",
        )
        self.drafts = 0
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.accepted_per_position = [0] * self.k
        self.generation_tokens = 0
        self.finished = 0
        self._credit: dict[str | None, float] = {}
        """Per request class, accepted tokens owed by its rate but not yet handed out (always
        below one)."""

    # ---- control ---------------------------------------------------------------------------

    def configure(self, tuning: Tuning) -> None:
        self.tuning = tuning
        self.slots.resize(tuning.max_running)

    @property
    def running(self) -> int:
        return self.slots.running

    @property
    def waiting(self) -> int:
        return self.slots.waiting

    @property
    def kv_cache_usage(self) -> float:
        return min(1.0, self.slots.running / self.slots.capacity)

    # ---- a request's life ------------------------------------------------------------------

    @asynccontextmanager
    async def admit(self, request_class: str | None = None) -> AsyncIterator[Run]:
        """Wait for a slot, hold it for the block; the queue time is observed once scheduled."""
        arrived = self.clock()
        await self.slots.acquire()
        try:
            self.queue_time.observe(self.clock() - arrived)
            yield Run(self, arrived, request_class)
        finally:
            self.slots.release()

    def step_seconds(self) -> float:
        """One forward step now: slower the fuller the batch."""
        load = min(1.0, self.slots.running / self.slots.capacity)
        return self.tuning.step_seconds * (1.0 + self.tuning.batch_slowdown * load)

    def verify_drafts(self, request_class: str | None = None) -> int:
        """One step's verification of k draft tokens of a request of `request_class`: how many
        are accepted.

        Deterministic: the class's rate's share of k is added to the class's running credit and
        its whole part is accepted, so over any run a class's accepted / draft tokens is its
        configured rate to within one token, whatever the rate was changed to along the way."""
        if self.k == 0:
            return 0
        credit = self._credit.get(request_class, 0.0)
        credit += self.tuning.acceptance_of(request_class) * self.k
        accepted = min(self.k, math.floor(credit + 1e-9))
        self._credit[request_class] = max(0.0, credit - accepted)
        self.drafts += 1
        self.draft_tokens += self.k
        self.accepted_tokens += accepted
        for position in range(accepted):
            self.accepted_per_position[position] += 1
        return accepted

    # ---- metrics ---------------------------------------------------------------------------

    def metric_lines(self, labels: Mapping[str, str]) -> list[str]:
        """vLLM 0.33.0's names and types; counters carry `_total`, as prometheus_client's do."""
        lines: list[str] = []

        def gauge(name: str, help_: str, value: float) -> None:
            lines.extend(
                [
                    f"# HELP {name} {help_}",
                    f"# TYPE {name} gauge",
                    f"{name}{label_set(labels)} {float(value)}",
                ]
            )

        def counter(name: str, help_: str, values: list[tuple[dict[str, str], int]]) -> None:
            lines.extend([f"# HELP {name} {help_}", f"# TYPE {name} counter"])
            for extra, value in values:
                lines.append(f"{name}_total{label_set({**labels, **extra})} {float(value)}")

        gauge("vllm:num_requests_running", "Requests in the running batch.", self.running)
        gauge("vllm:num_requests_waiting", "Requests waiting for a slot.", self.waiting)
        gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage as a fraction (1 = full); here running / capacity.",
            self.kv_cache_usage,
        )
        for histogram in (self.time_to_first_token, self.inter_token_latency, self.queue_time):
            lines.extend(histogram.lines(labels))
        counter(
            "vllm:generation_tokens", "Output tokens generated.", [({}, self.generation_tokens)]
        )
        counter(
            "vllm:request_success",
            "Requests finished (all at their max_tokens here).",
            [({"finished_reason": "length"}, self.finished)],
        )
        if self.k:
            counter("vllm:spec_decode_num_drafts", "Draft batches verified.", [({}, self.drafts)])
            counter(
                "vllm:spec_decode_num_draft_tokens",
                "Draft tokens verified.",
                [({}, self.draft_tokens)],
            )
            counter(
                "vllm:spec_decode_num_accepted_tokens",
                "Draft tokens accepted.",
                [({}, self.accepted_tokens)],
            )
            counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Draft tokens accepted, per position in the draft.",
                [({"position": str(p)}, n) for p, n in enumerate(self.accepted_per_position)],
            )
        return lines


class Run:
    """A request holding a slot: its first token, then its decode steps."""

    def __init__(
        self, scheduler: Scheduler, arrived: float, request_class: str | None = None
    ) -> None:
        self.scheduler = scheduler
        self.arrived = arrived
        self.request_class = request_class
        self.tokens = 0
        self._last_token_at = arrived

    async def first_token(self, *, prefilled_elsewhere: bool) -> None:
        """Compute the prompt here (a prefill, or a decode asked directly), or, when a remote
        prefill computed the KV, run the one step that turns it into the first token."""
        scheduler = self.scheduler
        if prefilled_elsewhere:
            await asyncio.sleep(scheduler.step_seconds())
        else:
            await asyncio.sleep(scheduler.tuning.prefill_seconds)
        now = scheduler.clock()
        scheduler.time_to_first_token.observe(now - self.arrived)
        self._emit(1, now)

    async def decode(self, max_tokens: int) -> None:
        """Steps until `max_tokens` are out: each emits one token plus the accepted drafts."""
        scheduler = self.scheduler
        while self.tokens < max_tokens:
            await asyncio.sleep(scheduler.step_seconds())
            accepted = scheduler.verify_drafts(self.request_class)
            emitted = min(1 + accepted, max_tokens - self.tokens)
            now = scheduler.clock()
            scheduler.inter_token_latency.observe(now - self._last_token_at)
            self._emit(emitted, now)
        scheduler.finished += 1

    def _emit(self, tokens: int, now: float) -> None:
        self.tokens += tokens
        self.scheduler.generation_tokens += tokens
        self._last_token_at = now


def max_tokens_of(body: Mapping[str, Any]) -> int:
    """The output length a completion or chat request asks for, within 1..MAX_TOKENS_CAP."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return min(max(value, 1), MAX_TOKENS_CAP)
    return DEFAULT_MAX_TOKENS

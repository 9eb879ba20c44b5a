"""Reads the few metrics the autoscaler and the hand-off verdict use out of an engine's `/metrics`
text: vLLM 0.33.0's, and the fixed connector's hand-off counters (`pdmtp_engine.handoff`).

Pure: text and the time it was scraped in, numbers out. It reads the Prometheus text exposition
format only as far as these names need: comments and `_bucket`/`_created` series are skipped,
label values may hold any escaped character, and a series that appears under several label sets
(one per engine of a data-parallel pod, one per model name) is folded into one number per pod:
counts and totals are summed, the KV-cache fraction is averaged over the engines.

Names, as vLLM 0.33.0 serves them (`vllm/v1/metrics/loggers.py`, `vllm/v1/spec_decode/metrics.py`):
prometheus_client appends `_total` to a counter's name, so both spellings are accepted.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
"""A fraction in [0, 1] despite its name."""
TIME_TO_FIRST_TOKEN = "vllm:time_to_first_token_seconds"
INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"
QUEUE_TIME = "vllm:request_queue_time_seconds"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
DRAFTS = "vllm:spec_decode_num_drafts"
FAILED_RECVS = "vllm:mooncake_num_failed_recvs"
KV_PULLED_REQUESTS = "pdmtp:kv_pulled_requests"
KV_PULLED_TOKENS = "pdmtp:kv_pulled_tokens"
KV_BACKOFF_TOKENS = "pdmtp:kv_backoff_tokens"
KV_DECODE_ONLY_REQUESTS = "pdmtp:kv_decode_only_requests"

_GAUGES = (WAITING, RUNNING, KV_CACHE_USAGE)
_HISTOGRAMS = (TIME_TO_FIRST_TOKEN, INTER_TOKEN_LATENCY, QUEUE_TIME)
_COUNTERS = (
    ACCEPTED_TOKENS,
    DRAFTS,
    FAILED_RECVS,
    KV_PULLED_REQUESTS,
    KV_PULLED_TOKENS,
    KV_BACKOFF_TOKENS,
    KV_DECODE_ONLY_REQUESTS,
)


def _wanted_names() -> dict[str, str]:
    """Exposed series name -> the key it is folded under."""
    wanted = {name: name for name in _GAUGES}
    for name in _HISTOGRAMS:
        wanted[f"{name}_sum"] = f"{name}_sum"
        wanted[f"{name}_count"] = f"{name}_count"
    for name in _COUNTERS:
        wanted[name] = name
        wanted[f"{name}_total"] = name
    return wanted


_WANTED = _wanted_names()


@dataclass(frozen=True)
class HistogramTotals:
    """A histogram's running `_sum` and `_count`: two of them give a windowed mean."""

    sum: float
    count: float


@dataclass(frozen=True)
class Scrape:
    """One pod's metrics at one moment; None where the engine did not serve the metric."""

    at: float
    """When it was scraped (seconds, the caller's clock)."""
    waiting: float | None = None
    running: float | None = None
    kv_cache_usage: float | None = None
    time_to_first_token: HistogramTotals | None = None
    inter_token_latency: HistogramTotals | None = None
    queue_time: HistogramTotals | None = None
    accepted_tokens: float | None = None
    drafts: float | None = None
    failed_recvs: float | None = None
    """KV receives that failed on a decode (vLLM's Mooncake worker)."""
    kv_pulled_requests: float | None = None
    kv_pulled_tokens: float | None = None
    kv_backoff_tokens: float | None = None
    kv_decode_only_requests: float | None = None
    """The fixed connector's hand-off counts; None on an engine without it."""


def parse_scrape(text: str, at: float) -> Scrape:
    """The metrics out of one `/metrics` answer scraped at `at`."""
    totals: dict[str, float] = {}
    series: dict[str, int] = {}
    for name, value in samples(text):
        key = _WANTED.get(name)
        if key is None:
            continue
        totals[key] = totals.get(key, 0.0) + value
        series[key] = series.get(key, 0) + 1

    def histogram(name: str) -> HistogramTotals | None:
        total, count = totals.get(f"{name}_sum"), totals.get(f"{name}_count")
        if total is None or count is None:
            return None
        return HistogramTotals(total, count)

    kv_total = totals.get(KV_CACHE_USAGE)
    return Scrape(
        at=at,
        waiting=totals.get(WAITING),
        running=totals.get(RUNNING),
        kv_cache_usage=None if kv_total is None else kv_total / series[KV_CACHE_USAGE],
        time_to_first_token=histogram(TIME_TO_FIRST_TOKEN),
        inter_token_latency=histogram(INTER_TOKEN_LATENCY),
        queue_time=histogram(QUEUE_TIME),
        accepted_tokens=totals.get(ACCEPTED_TOKENS),
        drafts=totals.get(DRAFTS),
        failed_recvs=totals.get(FAILED_RECVS),
        kv_pulled_requests=totals.get(KV_PULLED_REQUESTS),
        kv_pulled_tokens=totals.get(KV_PULLED_TOKENS),
        kv_backoff_tokens=totals.get(KV_BACKOFF_TOKENS),
        kv_decode_only_requests=totals.get(KV_DECODE_ONLY_REQUESTS),
    )


def samples(text: str) -> Iterator[tuple[str, float]]:
    """(series name, value) for every well-formed sample line with a finite value.

    Labels are skipped, not returned: the autoscaler folds every label set of a name together.
    A malformed line is skipped rather than failing the whole scrape.
    """
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line or line.startswith("#"):
            continue
        parsed = _name_and_rest(line)
        if parsed is None:
            continue
        name, rest = parsed
        fields = rest.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if math.isfinite(value):
            yield name, value


def _name_and_rest(line: str) -> tuple[str, str] | None:
    """Split a sample line into its metric name and what follows the label set."""
    brace = line.find("{")
    first_space = len(line.split(maxsplit=1)[0])
    if brace == -1 or brace > first_space:
        return line[:first_space], line[first_space:]
    end = _end_of_labels(line, brace)
    if end is None:
        return None
    return line[:brace], line[end:]


def _end_of_labels(line: str, brace: int) -> int | None:
    """Index just past the `}` closing the label set opened at `brace`; quotes may hide `}`."""
    in_quotes = False
    index = brace + 1
    while index < len(line):
        char = line[index]
        if in_quotes and char == "\\":
            index += 2  # an escaped quote, backslash or newline inside a label value
            continue
        if char == '"':
            in_quotes = not in_quotes
        elif char == "}" and not in_quotes:
            return index + 1
        index += 1
    return None

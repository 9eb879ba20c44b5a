"""A decode's hand-off counters kept as windows: what it counted between two of its scrapes.

The verdict needs more than totals: a test on accepted tokens per draft needs the ratio's
variance, and under mixed traffic that variance comes from which requests a decode served, not
from the draft itself. Each window (one pod, one scrape interval) is a cluster of requests, and
the spread of the windows' ratios measures the variance from the data
(`core.verification.statistics`). The scraper keeps each pod's windows in memory, appending one
per scrape (`record`); an operator restart starts them again.

`PodMetrics` is what the scraper keeps per pod: its two latest scrapes (the autoscaler's rates)
and these windows.

Pure: scrapes in, windows out. The history is bounded: at `MAX_WINDOWS` neighbours are merged
pairwise, so old evidence is kept in coarser windows rather than dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pdmtp.core.promtext import Scrape

MAX_WINDOWS = 128
"""Windows kept per pod: at the default 15 s interval, 32 minutes before the first merge."""


@dataclass(frozen=True, slots=True)
class Window:
    """What one pod's engine counted between two of its scrapes."""

    start: float | None
    """When the window opened (the earlier scrape's time); None for a pod's first scrape, whose
    counts run from the engine's start."""
    end: float
    requests: float = 0.0
    """Requests that asked a prefill for their KV (`pdmtp:kv_pulled_requests`)."""
    pulled_tokens: float = 0.0
    backoff_tokens: float = 0.0
    failed: float = 0.0
    """KV receives that failed (`vllm:mooncake_num_failed_recvs`)."""
    decode_only: float = 0.0
    drafts: float = 0.0
    accepted: float = 0.0

    def merged(self, later: Window) -> Window:
        """This window and the one that follows it, as one."""
        return Window(
            self.start,
            later.end,
            self.requests + later.requests,
            self.pulled_tokens + later.pulled_tokens,
            self.backoff_tokens + later.backoff_tokens,
            self.failed + later.failed,
            self.decode_only + later.decode_only,
            self.drafts + later.drafts,
            self.accepted + later.accepted,
        )


_SOURCES = (
    # Window field -> Scrape field
    ("requests", "kv_pulled_requests"),
    ("pulled_tokens", "kv_pulled_tokens"),
    ("backoff_tokens", "kv_backoff_tokens"),
    ("failed", "failed_recvs"),
    ("decode_only", "kv_decode_only_requests"),
    ("drafts", "drafts"),
    ("accepted", "accepted_tokens"),
)


def between(previous: Scrape | None, latest: Scrape) -> Window:
    """What the pod counted from `previous` to `latest` (all of it without `previous`)."""
    counts = {field: _increase(latest, previous, source) for field, source in _SOURCES}
    return Window(None if previous is None else previous.at, latest.at, **counts)


def _increase(latest: Scrape, previous: Scrape | None, source: str) -> float:
    """A counter's increase since `previous`; a drop means the engine restarted (counted from
    zero); a counter the engine does not serve counts nothing."""
    now: float | None = getattr(latest, source)
    if now is None:
        return 0.0
    before: float | None = None if previous is None else getattr(previous, source)
    if before is None or now < before:
        return now
    return now - before


def record(
    windows: Sequence[Window], previous: Scrape | None, latest: Scrape
) -> tuple[Window, ...]:
    """`windows` with the one from `previous` (the pod's scrape before) to `latest` appended; a
    scrape no newer than `previous` adds nothing."""
    if previous is not None and latest.at <= previous.at:
        return tuple(windows)
    kept = [*windows, between(previous, latest)]
    if len(kept) > MAX_WINDOWS:
        kept = [
            kept[i].merged(kept[i + 1]) if i + 1 < len(kept) else kept[i]
            for i in range(0, len(kept), 2)
        ]
    return tuple(kept)


@dataclass(frozen=True)
class PodMetrics:
    """A pod's two latest scrapes, as the shell's metrics source holds them, and its counters'
    windows since the operator first scraped it (the verdict's evidence)."""

    latest: Scrape | None = None
    previous: Scrape | None = None
    windows: tuple[Window, ...] = ()

    def scraped(self, scrape: Scrape) -> PodMetrics:
        """These metrics after a new scrape; unchanged by one no newer than the latest (a file
        not rewritten)."""
        if self.latest is not None and scrape.at <= self.latest.at:
            return self
        return PodMetrics(scrape, self.latest, record(self.windows, self.latest, scrape))

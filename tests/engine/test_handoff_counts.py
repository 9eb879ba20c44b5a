"""The decode's hand-off counts, from vLLM's real scheduler to the Prometheus series vLLM exports.

The scheduler half counts; vLLM's scheduler merges its stats into the step's payload
(`SchedulerStats.kv_connector_stats`), which the API server rebuilds with the connector's own
classes and feeds to its Prometheus metrics. Each hop is vLLM's code, driven here.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
from pdmtp_engine.connector import BackoffMooncakeConnector
from pdmtp_engine.handoff import COUNTERS, HandoffStats
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.stats import MooncakeKVConnectorStats
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm_harness import (
    full_attention_kv_cache_config,
    make_request,
    make_scheduler,
    make_vllm_config,
    remote_prefill_params,
    write_tiny_mtp_checkpoint,
)

PROMPT_LEN = 40


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_mtp_checkpoint(tmp_path_factory.mktemp("handoff") / "mtp3", 3)


def decode_scheduler(checkpoint: Path, k: int) -> Scheduler:
    config = make_vllm_config(
        checkpoint, method="mtp", num_speculative_tokens=k, kv_role="kv_consumer"
    )
    return make_scheduler(config, full_attention_kv_cache_config())


def step_payload(scheduler: Scheduler) -> dict[str, Any] | None:
    """One engine step: what vLLM's scheduler puts in SchedulerStats.kv_connector_stats."""
    output = scheduler.schedule()
    # The step computed part of each scheduled prompt: nothing sampled yet.
    scheduled = list(output.num_scheduled_tokens)
    ran = ModelRunnerOutput(
        req_ids=scheduled,
        req_id_to_index={r: i for i, r in enumerate(scheduled)},
        sampled_token_ids=[[] for _ in scheduled],
    )
    engine_outputs = scheduler.update_from_output(output, ran)
    stats = [o.scheduler_stats for o in engine_outputs.values() if o.scheduler_stats]
    assert len(stats) == 1
    return stats[0].kv_connector_stats


def counts(payload: dict[str, Any] | None) -> dict[str, list[int]]:
    assert payload is not None
    return {key: payload[key] for key in COUNTERS}


@pytest.mark.parametrize(("k", "backoff", "refresh"), [(1, 0, 2), (2, 1, 2), (3, 2, 3)])
def test_a_pull_counts_its_tokens_the_backoff_and_the_refresh_the_decode_recomputes(
    checkpoint: Path, k: int, backoff: int, refresh: int
) -> None:
    """Backoff: the tokens the prefill stopped short of (the derived backoff, what the verdict
    holds it to); refresh: the prefill's last computed tokens, rebuilt for the drafter."""
    scheduler = decode_scheduler(checkpoint, k)
    for n in (PROMPT_LEN, PROMPT_LEN + 7):
        scheduler.add_request(make_request(n, kv_transfer_params=remote_prefill_params(f"x{n}")))
    assert counts(step_payload(scheduler)) == {
        "pulled_requests": [1, 1],
        "pulled_tokens": [PROMPT_LEN - backoff - refresh, PROMPT_LEN + 7 - backoff - refresh],
        "backoff_tokens": [backoff, backoff],
        "refreshed_tokens": [refresh, refresh],
        "decode_only_requests": [],
    }
    # Counted once: the next step (the requests still waiting for their KV) adds nothing.
    assert step_payload(scheduler) is None


def test_requests_a_decode_serves_without_a_prefill_are_decode_only(checkpoint: Path) -> None:
    scheduler = decode_scheduler(checkpoint, 3)
    unusable = remote_prefill_params()
    del unusable["remote_bootstrap_addr"]
    scheduler.add_request(make_request(PROMPT_LEN, kv_transfer_params=None))
    scheduler.add_request(make_request(PROMPT_LEN, kv_transfer_params=unusable))
    assert counts(step_payload(scheduler)) == {
        "pulled_requests": [],
        "pulled_tokens": [],
        "backoff_tokens": [],
        "refreshed_tokens": [],
        "decode_only_requests": [1, 1],
    }


def test_the_prefill_side_counts_nothing(checkpoint: Path) -> None:
    config = make_vllm_config(
        checkpoint, method="mtp", num_speculative_tokens=3, kv_role="kv_producer"
    )
    scheduler = make_scheduler(config, full_attention_kv_cache_config())
    scheduler.add_request(make_request(PROMPT_LEN, kv_transfer_params=None))
    assert step_payload(scheduler) is None


def test_a_worker_payload_merges_both_ways() -> None:
    """The worker's stats (a failed receive) and the scheduler half's, in either order, and a
    payload of vLLM's own class (no hand-off keys) rebuilt by the connector's class."""
    worker = HandoffStats()
    worker.record_failed_recv()
    scheduler_half = HandoffStats()
    scheduler_half.record_pull(35, backoff_tokens=2, refreshed_tokens=3)
    merged = worker.clone_and_reset().aggregate(scheduler_half.clone_and_reset())
    assert merged.data["num_failed_recvs"] == [1] and merged.data["pulled_tokens"] == [35]
    stock = MooncakeKVConnectorStats()
    stock.record_failed_recv()
    rebuilt = BackoffMooncakeConnector.build_kv_connector_stats(stock.clone_and_reset().data)
    assert isinstance(rebuilt, HandoffStats) and not rebuilt.is_empty()
    mine = HandoffStats()
    mine.record_decode_only()
    assert rebuilt.aggregate(mine).data["decode_only_requests"] == [1]
    assert not HandoffStats().aggregate(HandoffStats()).data["pulled_requests"]


def test_the_api_server_exports_them_as_counters(checkpoint: Path) -> None:
    registry = CollectorRegistry()
    types = {
        t: functools.partial(t, registry=registry)  # type: ignore[call-arg]
        for t in (Gauge, Counter, Histogram)
    }
    config = make_vllm_config(
        checkpoint, method="mtp", num_speculative_tokens=3, kv_role="kv_consumer"
    )
    labels = {"model_name": "tiny", "engine": "0"}
    metrics = BackoffMooncakeConnector.build_prom_metrics(
        config, types, list(labels), {0: list(labels.values())}
    )
    scheduler = decode_scheduler(checkpoint, 3)
    for i in range(3):
        params = remote_prefill_params(f"x{i}")
        scheduler.add_request(make_request(PROMPT_LEN, kv_transfer_params=params))
    scheduler.add_request(make_request(PROMPT_LEN, kv_transfer_params=None))
    payload = step_payload(scheduler)
    assert payload is not None
    metrics.observe(payload)
    stock = MooncakeKVConnectorStats()
    stock.record_failed_recv()
    metrics.observe(stock.clone_and_reset().data)  # a payload without the hand-off keys

    def value(name: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("pdmtp:kv_pulled_requests_total") == 3
    assert value("pdmtp:kv_pulled_tokens_total") == 3 * (PROMPT_LEN - 2 - 3)
    assert value("pdmtp:kv_backoff_tokens_total") == 3 * 2
    assert value("pdmtp:kv_refreshed_tokens_total") == 3 * 3
    assert value("pdmtp:kv_decode_only_requests_total") == 1
    assert value("vllm:mooncake_num_failed_recvs_total") == 1

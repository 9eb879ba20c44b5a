"""The backoff-fixed Mooncake connector inside vLLM's real scheduler, against vLLM's stock one.

Each scenario runs both connectors with explicit numbers for each: the stock connector's numbers
are the bug (it ships or pulls the full 40-token prompt under a 3-token lookahead), so these
tests fail for it by construction and pass only where the fix changes behaviour.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from pdmtp_engine.connector import (
    TRUNCATED_MARKER,
    BackoffMooncakeConnector,
    BackoffMooncakeConnectorScheduler,
)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_scheduler import (
    NixlBaseConnectorScheduler,
)
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm_harness import (
    BLOCK_SIZE,
    FIXED_CONNECTOR,
    STOCK_CONNECTOR,
    full_attention_kv_cache_config,
    hybrid_mamba_kv_cache_config,
    make_request,
    make_scheduler,
    make_vllm_config,
    remote_decode_params,
    remote_prefill_params,
    write_tiny_mtp_checkpoint,
)

PROMPT_LEN = 40

CONNECTORS = {"stock": STOCK_CONNECTOR, "fixed": FIXED_CONNECTOR}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    return {m: write_tiny_mtp_checkpoint(root / f"mtp{m}", m) for m in (1, 3)}


def prefill_schedule(
    checkpoint: Path,
    connector: str,
    method: str | None,
    k: int,
    prompt_len: int = PROMPT_LEN,
    prompt_logprobs: int | None = None,
) -> tuple[int, list[int], dict[str, object]]:
    """Tokens the prefill engine schedules for a remote-decode request, its prompt, its params."""
    config = make_vllm_config(
        checkpoint,
        method=method,
        num_speculative_tokens=k,
        kv_role="kv_producer",
        connector=CONNECTORS[connector],
    )
    scheduler = make_scheduler(config, full_attention_kv_cache_config())
    request = make_request(
        prompt_len, kv_transfer_params=remote_decode_params(), prompt_logprobs=prompt_logprobs
    )
    scheduler.add_request(request)
    output = scheduler.schedule()
    assert request.kv_transfer_params is not None
    return (
        output.num_scheduled_tokens[request.request_id],
        list(request.prompt_token_ids or []),
        dict(request.kv_transfer_params),
    )


def feed_partial_prefill_output(
    scheduler: Scheduler, output: SchedulerOutput, request: Request
) -> None:
    """Report a step that computed part of the prompt: nothing is sampled yet."""
    scheduler.update_from_output(
        output,
        ModelRunnerOutput(
            req_ids=[request.request_id],
            req_id_to_index={request.request_id: 0},
            sampled_token_ids=[[]],
        ),
    )


def decode_remote_tokens(checkpoint: Path, connector: str, method: str | None, k: int) -> int:
    """Tokens of remote KV the decode engine asks the prefiller for, for one request."""
    config = make_vllm_config(
        checkpoint,
        method=method,
        num_speculative_tokens=k,
        kv_role="kv_consumer",
        connector=CONNECTORS[connector],
    )
    scheduler = make_scheduler(config, full_attention_kv_cache_config())
    request = make_request(PROMPT_LEN, kv_transfer_params=remote_prefill_params())
    scheduler.add_request(request)
    output = scheduler.schedule()
    # The load is asynchronous: nothing is computed locally in this step, and the scheduler
    # records the remote tokens as the request's computed tokens while it waits for them.
    assert request.request_id not in output.num_scheduled_tokens
    assert request.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    return request.num_computed_tokens


@pytest.mark.parametrize(
    ("connector", "expected_scheduled"), [("stock", PROMPT_LEN), ("fixed", PROMPT_LEN - 2)]
)
def test_prefill_side_stops_lookahead_minus_one_short(
    checkpoints: dict[int, Path], connector: str, expected_scheduled: int
) -> None:
    """mtp, k=3, 3 MTP modules: lookahead 3, so the prefiller computes 38 of 40 tokens."""
    scheduled, prompt, params = prefill_schedule(checkpoints[3], connector, "mtp", 3)
    assert scheduled == expected_scheduled
    assert len(prompt) == expected_scheduled
    assert bool(params.get(TRUNCATED_MARKER)) == (connector == "fixed")


@pytest.mark.parametrize(
    ("connector", "expected_remote_tokens"), [("stock", PROMPT_LEN), ("fixed", PROMPT_LEN - 5)]
)
def test_decode_side_pulls_prompt_minus_backoff_and_refresh(
    checkpoints: dict[int, Path], connector: str, expected_remote_tokens: int
) -> None:
    """The decoder pulls 35 tokens of KV and recomputes 5: the 2 the prefiller never computed
    and the 3 whose drafter KV the prefiller built from tokens past its truncated prompt."""
    assert decode_remote_tokens(checkpoints[3], connector, "mtp", 3) == expected_remote_tokens


def fixed_scheduler(checkpoint: Path, k: int, kv_role: str) -> Scheduler:
    """vLLM's scheduler for one side of a fixed pair: MTP k, full-attention KV cache."""
    config = make_vllm_config(
        checkpoint,
        method="mtp",
        num_speculative_tokens=k,
        kv_role=kv_role,
        connector=FIXED_CONNECTOR,
    )
    return make_scheduler(config, full_attention_kv_cache_config())


def prefill_shipped_blocks(checkpoint: Path, k: int, prompt_lens: range) -> dict[int, list[int]]:
    """Per prompt length, the blocks (per KV cache group) the fixed prefiller queues for the
    decoder once a remote-decode request (max_tokens 1, as the router sends it) has run."""
    scheduler = fixed_scheduler(checkpoint, k, "kv_producer")
    requests = {
        n: make_request(n, kv_transfer_params=remote_decode_params(f"p{n}"), max_tokens=1)
        for n in prompt_lens
    }
    for request in requests.values():
        scheduler.add_request(request)
    shipped: dict[str, list[list[int]]] = {}
    for _ in range(len(requests) + 1):  # the token budget spreads them over a few steps
        output = scheduler.schedule()
        sending = output.kv_connector_metadata.reqs_to_send  # type: ignore[union-attr]
        shipped |= {r: blocks for r, (_, blocks) in sending.items()}
        ids = list(output.num_scheduled_tokens)
        if not ids:
            break
        # A step that completes a prompt samples its one token; a partial chunk samples none.
        done = {r.request_id for r in requests.values() if r.num_computed_tokens >= r.num_tokens}
        scheduler.update_from_output(
            output,
            ModelRunnerOutput(
                req_ids=ids,
                req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=[[7] if r in done else [] for r in ids],
            ),
        )
    return {n: [len(group) for group in shipped[r.request_id]] for n, r in requests.items()}


def decode_requested_blocks(checkpoint: Path, k: int, prompt_lens: range) -> dict[int, list[int]]:
    """Per prompt length, the blocks the fixed decoder asks the prefiller to fill."""
    scheduler = fixed_scheduler(checkpoint, k, "kv_consumer")
    requests = {
        n: make_request(n, kv_transfer_params=remote_prefill_params(f"d{n}")) for n in prompt_lens
    }
    for request in requests.values():
        scheduler.add_request(request)
    metadata = scheduler.schedule().kv_connector_metadata
    pulls = metadata.reqs_to_recv["prefill-engine"]  # type: ignore[union-attr]
    return {
        n: [len(group) for group in pulls[r.request_id].local_block_ids]
        for n, r in requests.items()
    }


@pytest.mark.parametrize(("k", "backoff", "refresh"), [(1, 0, 2), (2, 1, 2), (3, 2, 3)])
def test_the_prefill_ships_exactly_the_blocks_the_decode_pulls(
    checkpoints: dict[int, Path], k: int, backoff: int, refresh: int
) -> None:
    """vLLM's Mooncake sender pairs a decode asking for fewer blocks than the prefill holds with
    the prefill's last blocks (it reads the difference as the decode's own prefix-cache hit), so
    a prefill that computed a block more than the decode pulls would shift every block by one.
    Across two block boundaries (16 tokens), the lists match, including the lengths where the
    prefill computed more blocks than it ships."""
    lengths = range(30, 52)
    shipped = prefill_shipped_blocks(checkpoints[3], k, lengths)
    assert shipped == decode_requested_blocks(checkpoints[3], k, lengths)
    assert shipped == {n: [-(-(n - backoff - refresh) // BLOCK_SIZE)] for n in lengths}
    trimmed = [n for n in lengths if -(-(n - backoff) // BLOCK_SIZE) > shipped[n][0]]
    assert trimmed, "no length where the prefill computed more blocks than the decode pulls"


@pytest.mark.parametrize("connector", ["stock", "fixed"])
@pytest.mark.parametrize(
    ("method", "k", "mtp_modules", "lookahead"),
    [
        (None, 0, 3, 0),  # no speculation
        ("mtp", 3, 1, 1),  # single-module MTP: the drafter reads one token ahead
        ("mtp", 1, 3, 1),  # k=1 on a multi-module checkpoint is single-module MTP
        ("deepseek_mtp", 2, 1, 1),  # an alias, normalised to mtp
    ],
)
def test_lookahead_up_to_one_leaves_dense_requests_unchanged(
    checkpoints: dict[int, Path],
    connector: str,
    method: str | None,
    k: int,
    mtp_modules: int,
    lookahead: int,
) -> None:
    checkpoint = checkpoints[mtp_modules]
    config = make_vllm_config(checkpoint, method=method, num_speculative_tokens=k)
    assert config.num_prefill_lookahead_tokens == lookahead
    scheduled, prompt, params = prefill_schedule(checkpoint, connector, method, k)
    assert (scheduled, len(prompt)) == (PROMPT_LEN, PROMPT_LEN)
    assert TRUNCATED_MARKER not in params
    # With a drafter, the fixed decode recomputes two tokens, not the one vLLM always does:
    # one alone gets padded with placeholder drafts, an empty draft round.
    refresh = 2 if connector == "fixed" and lookahead else 0
    assert decode_remote_tokens(checkpoint, connector, method, k) == PROMPT_LEN - refresh


def test_truncation_happens_once_across_preemption_and_reschedule(
    checkpoints: dict[int, Path],
) -> None:
    """A chunked prefill preempted mid-way resumes on the truncated prompt, cut once."""
    prompt_len, chunk = 100, 64
    config = make_vllm_config(
        checkpoints[3],
        method="mtp",
        num_speculative_tokens=3,
        kv_role="kv_producer",
        max_num_batched_tokens=chunk,
    )
    scheduler = make_scheduler(config, full_attention_kv_cache_config())
    request = make_request(prompt_len, kv_transfer_params=remote_decode_params())
    original_prompt = list(request.prompt_token_ids or [])
    scheduler.add_request(request)
    first = scheduler.schedule()
    assert first.num_scheduled_tokens[request.request_id] == chunk
    feed_partial_prefill_output(scheduler, first, request)

    # vLLM's own preemption path: blocks freed, computed tokens reset, back to the queue.
    scheduler.running.remove(request)
    scheduler._preempt_request(request, time.monotonic())
    assert request.status == RequestStatus.PREEMPTED and request.num_computed_tokens == 0
    # A re-added request (a second on_new_request) must not cut two more tokens either.
    assert scheduler.connector is not None
    scheduler.connector.on_new_request(request)

    # Run the resumed prefill to its end. Whatever the prefix cache serves from before the
    # preemption, it ends exactly two tokens short of the original prompt, never four.
    for _ in range(4):
        step = scheduler.schedule()
        assert 0 < step.num_scheduled_tokens[request.request_id] <= chunk
        if request.num_computed_tokens >= request.num_prompt_tokens:
            break
        feed_partial_prefill_output(scheduler, step, request)
    assert request.num_computed_tokens == prompt_len - 2
    assert request.prompt_token_ids == original_prompt[: prompt_len - 2]
    assert request.num_prompt_tokens == prompt_len - 2
    assert request.max_tokens == 1


@pytest.mark.parametrize("connector", ["stock", "fixed"])
def test_prompt_logprob_requests_are_untouched(
    checkpoints: dict[int, Path], connector: str
) -> None:
    """They skip the prefix cache, so the decoder loads nothing: the prefiller computes all."""
    scheduled, prompt, params = prefill_schedule(
        checkpoints[3], connector, "mtp", 3, prompt_logprobs=1
    )
    assert (scheduled, len(prompt)) == (PROMPT_LEN, PROMPT_LEN)
    assert TRUNCATED_MARKER not in params


def test_prompt_no_longer_than_backoff_is_left_whole_on_both_sides(
    checkpoints: dict[int, Path],
) -> None:
    scheduled, prompt, params = prefill_schedule(checkpoints[3], "fixed", "mtp", 3, prompt_len=2)
    assert (scheduled, len(prompt)) == (2, 2)
    assert TRUNCATED_MARKER not in params
    config = make_vllm_config(
        checkpoints[3], method="mtp", num_speculative_tokens=3, kv_role="kv_consumer"
    )
    connector = BackoffMooncakeConnector(
        config, KVConnectorRole.SCHEDULER, full_attention_kv_cache_config()
    )
    assert isinstance(connector.connector_scheduler, BackoffMooncakeConnectorScheduler)
    # Backoff 2, refresh 3: a prefill that computed no more than the refresh is pulled whole.
    assert connector.connector_scheduler._get_remote_prefill_token_count(2) == 2
    assert connector.connector_scheduler._get_remote_prefill_token_count(3) == 1
    assert connector.connector_scheduler._get_remote_prefill_token_count(5) == 3
    assert connector.connector_scheduler._get_remote_prefill_token_count(6) == 1


@pytest.mark.parametrize("connector", ["stock", "fixed"])
def test_mamba_state_backoff_stays_one_token(checkpoints: dict[int, Path], connector: str) -> None:
    """Hybrid Mamba with no MTP: both connectors back off exactly one token on both sides."""
    for kv_role, params in (
        ("kv_producer", remote_decode_params()),
        ("kv_consumer", remote_prefill_params()),
    ):
        config = make_vllm_config(
            checkpoints[1], method=None, kv_role=kv_role, connector=CONNECTORS[connector]
        )
        config.scheduler_config.disable_hybrid_kv_cache_manager = False
        kv_connector = KVConnectorFactory.create_connector(
            config, KVConnectorRole.SCHEDULER, hybrid_mamba_kv_cache_config()
        )
        request = make_request(PROMPT_LEN, kv_transfer_params=params)
        kv_connector.on_new_request(request)
        if kv_role == "kv_producer":
            assert request.num_prompt_tokens == PROMPT_LEN - 1
            assert request.kv_transfer_params is not None
            assert request.kv_transfer_params[TRUNCATED_MARKER] is True
        else:
            remote, is_async = kv_connector.get_num_new_matched_tokens(request, 0)
            assert (remote, is_async) == (PROMPT_LEN - 1, True)


def test_mamba_and_multi_module_mtp_take_the_larger_backoff(checkpoints: dict[int, Path]) -> None:
    config = make_vllm_config(
        checkpoints[3], method="mtp", num_speculative_tokens=3, kv_role="kv_producer"
    )
    config.scheduler_config.disable_hybrid_kv_cache_manager = False
    connector = BackoffMooncakeConnector(
        config, KVConnectorRole.SCHEDULER, hybrid_mamba_kv_cache_config()
    )
    scheduler = connector.connector_scheduler
    assert isinstance(scheduler, BackoffMooncakeConnectorScheduler)
    assert (scheduler.lookahead, scheduler.state_backoff, scheduler.prefill_backoff) == (3, 1, 2)
    request = make_request(PROMPT_LEN, kv_transfer_params=remote_decode_params())
    connector.on_new_request(request)
    assert request.num_prompt_tokens == PROMPT_LEN - 2


@pytest.mark.parametrize(
    ("k", "mtp_modules", "hybrid"),
    [(k, m, hybrid) for k in (1, 2, 3, 6) for m in (1, 3) for hybrid in (False, True)],
)
def test_backoff_equals_vllm_nixl_rule(
    checkpoints: dict[int, Path], k: int, mtp_modules: int, hybrid: bool
) -> None:
    """Our backoff is vLLM's NIXL connector's `_prefill_backoff`, evaluated by vLLM's own code."""
    config = make_vllm_config(
        checkpoints[mtp_modules], method="mtp", num_speculative_tokens=k, kv_role="kv_producer"
    )
    config.scheduler_config.disable_hybrid_kv_cache_manager = not hybrid
    kv_cache_config = hybrid_mamba_kv_cache_config() if hybrid else full_attention_kv_cache_config()
    scheduler = BackoffMooncakeConnectorScheduler(config, "engine", kv_cache_config)
    nixl_view = SimpleNamespace(
        _has_mamba=kv_cache_config.has_mamba_layers, _bounded_replay=False, vllm_config=config
    )
    assert scheduler.prefill_backoff == NixlBaseConnectorScheduler._prefill_backoff(nixl_view)

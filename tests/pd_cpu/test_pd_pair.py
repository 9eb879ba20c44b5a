"""The fixed pair: greedy output identical to one engine, and the backoff split per request.

For numSpeculativeTokens k in {2, 3} with a 3-module MTP checkpoint vLLM's lookahead is k, so
the backoff is k - 1: the prefill must compute N - (k - 1) prompt tokens, the decode must load
that many and recompute the remaining k - 1 itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fleet import (
    Completion,
    Figures,
    Fleet,
    Served,
    counts_since,
    handoff_counts,
    serve_all,
    start_router,
    transfer_durations_ms,
)
from tier import MAX_TOKENS, fixed_launches
from wiring import EngineWiring


@dataclass(frozen=True)
class PairRun:
    k: int
    backoff: int
    wiring: dict[str, EngineWiring]
    served: list[Served]
    launcher_lines: dict[str, list[str]]
    transfers_ms: list[float]
    handoff: dict[str, float]
    """The decode's hand-off and drafting counters over the run (fleet.HANDOFF_SERIES)."""


@pytest.fixture(scope="module", params=[2, 3], ids=lambda k: f"k{k}")
def pair_run(
    request: pytest.FixtureRequest,
    fleet: Fleet,
    model: Path,
    prompts: list,
    figures: Figures,
    workdir: Path,
    reference: dict[str, Completion],  # the reference runs (and is released) first
    wirings: Callable[[int], dict[str, EngineWiring]],
) -> Iterator[PairRun]:
    k: int = request.param
    wiring = wirings(k)
    launches = fixed_launches(k, wiring)
    prefill, decode = fleet.acquire(launches)
    router = start_router(wiring["prefill"], wiring["decode"], workdir, f"router-k{k}")
    try:
        before = handoff_counts(decode)
        served = serve_all(router.url, model, prompts, MAX_TOKENS, prefill=prefill, decode=decode)
        handoff = counts_since(handoff_counts(decode), before)
        for launch, engine in zip(launches, (prefill, decode), strict=True):
            figures.note_rss(launch.name, engine)
    finally:
        router.process.stop()
        fleet.release([launch.name for launch in launches])
    transfers = transfer_durations_ms(prefill)
    figures.request_seconds[f"pd-k{k}"] = [round(s.completion.seconds, 3) for s in served]
    figures.transfer_ms[f"pd-k{k}"] = transfers
    figures.notes.setdefault("handoff", {})[f"k{k}"] = handoff
    figures.notes.setdefault("substitutions", {})[f"k{k}"] = {
        role: list(wiring[role].substituted) for role in wiring
    }
    yield PairRun(
        k=k,
        backoff=k - 1,
        wiring=wiring,
        served=served,
        launcher_lines={
            role: [
                line
                for line in engine.process.log(tail=10**7).splitlines()
                if line.startswith("pdmtp-engine:")
            ]
            for role, engine in (("prefill", prefill), ("decode", decode))
        },
        transfers_ms=transfers,
        handoff=handoff,
    )


def test_the_launcher_verified_the_rendered_config_and_started_vllm(pair_run: PairRun) -> None:
    k, backoff = pair_run.k, pair_run.backoff
    for role, kv_role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
        assert pair_run.wiring[role].env["PDMTP_EXPECTED_LOOKAHEAD"] == str(k)
        assert pair_run.wiring[role].env["PDMTP_EXPECTED_PREFILL_BACKOFF"] == str(backoff)
        assert pair_run.launcher_lines[role] == [
            f"pdmtp-engine: method=mtp k={k} mtp_modules=3, lookahead={k}, "
            f"prefill_backoff={backoff}, kv_role={kv_role}: starting vLLM"
        ]


def test_greedy_outputs_are_identical_to_one_engine(
    pair_run: PairRun, reference: dict[str, Completion]
) -> None:
    differing = {}
    for one in pair_run.served:
        got, want = one.completion, reference[one.prompt.name]
        assert got.status == 200, f"{one.prompt.name}: {got.error}"
        assert got.token_ids is not None, "the router dropped return_token_ids"
        if got.token_ids != want.token_ids:
            differing[one.prompt.name] = (got.token_ids, want.token_ids)
    assert differing == {}


def test_prefill_computes_all_but_the_backoff_and_decode_recomputes_it(
    pair_run: PairRun,
) -> None:
    backoff = pair_run.backoff
    for one in pair_run.served:
        n = len(one.prompt.token_ids)
        assert one.accounting is not None
        assert dict(one.accounting.prefill) == {
            "local_compute": n - backoff,
            "local_cache_hit": 0,
            "external_kv_transfer": 0,
        }, one.prompt.name
        assert dict(one.accounting.decode) == {
            "local_compute": backoff,
            "local_cache_hit": 0,
            "external_kv_transfer": n - backoff,
        }, one.prompt.name


def test_every_request_pushed_its_kv_over_mooncake(pair_run: PairRun) -> None:
    assert len(pair_run.transfers_ms) == len(pair_run.served)


def test_the_decode_exports_the_hand_off_it_made(pair_run: PairRun) -> None:
    """The connector's counters agree with the per-request accounting above: every request
    pulled N - backoff tokens and recomputed the backoff, none fell back to decode-only, no
    receive failed; and the decode drafted (vLLM's spec-decode counters)."""
    prompt_lens = [len(one.prompt.token_ids) for one in pair_run.served]
    handoff = pair_run.handoff
    assert handoff["pdmtp:kv_pulled_requests_total"] == len(prompt_lens), handoff
    assert handoff["pdmtp:kv_pulled_tokens_total"] == sum(prompt_lens) - len(prompt_lens) * (
        pair_run.backoff
    ), handoff
    assert handoff["pdmtp:kv_backoff_tokens_total"] == len(prompt_lens) * pair_run.backoff
    assert handoff["pdmtp:kv_decode_only_requests_total"] == 0, handoff
    assert handoff.get("vllm:mooncake_num_failed_recvs_total", 0) == 0, handoff
    assert handoff["vllm:spec_decode_num_drafts_total"] > 0, handoff
    assert (
        0
        <= handoff["vllm:spec_decode_num_accepted_tokens_total"]
        <= (handoff["vllm:spec_decode_num_draft_tokens_total"])
    ), handoff

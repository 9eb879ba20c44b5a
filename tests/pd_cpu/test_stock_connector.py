"""Discrimination: the same setup with vLLM's stock `MooncakeConnector` shows no backoff and one
empty draft round per request, and a fixed prefill paired with a stock decode gives answers the
comparison with one engine rejects.

k=3 on the 3-module checkpoint: the fixed pair backs off 2 tokens (test_pd_pair.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fleet import (
    Completion,
    Figures,
    Fleet,
    Prompt,
    Served,
    drafting_of,
    serve_all,
    start_router,
)
from runs import STOCK_K, PairRun, StockRun, stock_name
from tier import MAX_TOKENS, launch
from wiring import EngineWiring

K = STOCK_K


def served_through(
    fleet: Fleet,
    workdir: Path,
    model: Path,
    prompts: list[Prompt],
    pair: dict[str, tuple[str, EngineWiring, bool]],
) -> list[Served]:
    """Serve every prompt through a router in front of `pair` (role -> name, wiring, launcher)."""
    launches = [launch(name, wiring, via_launcher=v) for name, wiring, v in pair.values()]
    prefill, decode = fleet.acquire(launches)
    router_name = "router-" + "+".join(name for name, _, _ in pair.values())
    router = start_router(pair["prefill"][1], pair["decode"][1], workdir, router_name)
    try:
        return serve_all(router.url, model, prompts, MAX_TOKENS, prefill=prefill, decode=decode)
    finally:
        router.process.stop()
        fleet.release([one.name for one in launches])


def test_stock_connectors_on_both_sides_back_off_nothing(
    stock_pair: StockRun, reference: dict[str, Completion], figures: Figures
) -> None:
    handoff, served = stock_pair.handoff, stock_pair.served
    # Beside the fixed pair's (figures "handoff"): the stock decode's counters, for the record.
    figures.notes.setdefault("handoff", {})[f"stock-k{K}"] = handoff
    # vLLM's stock connector exports no hand-off counts; its drafting counters are vLLM's.
    assert not any(name.startswith("pdmtp:") for name in handoff), handoff
    assert handoff["vllm:spec_decode_num_drafts_total"] > 0, handoff
    figures.notes["stock_pair"] = [
        {
            "prompt": s.prompt.name,
            "prefill": s.accounting and dict(s.accounting.prefill),
            "decode": s.accounting and dict(s.accounting.decode),
            "same_as_reference": s.completion.token_ids == reference[s.prompt.name].token_ids,
        }
        for s in served
    ]
    for one in served:
        n = len(one.prompt.token_ids)
        assert one.completion.status == 200, one.completion.error
        assert one.accounting is not None
        # The prefill computes the whole prompt, and the decode loads what it computed and
        # recomputes at most the one token vLLM's scheduler always recomputes.
        assert one.accounting.prefill["local_compute"] == n, one.prompt.name
        decode = one.accounting.decode
        assert decode["external_kv_transfer"] >= n - 1, one.prompt.name
        assert decode["local_compute"] <= 1, one.prompt.name


def test_the_stock_decode_spends_one_empty_draft_round_per_request(
    stock_pair: StockRun,
    fixed_pair: Callable[[int], PairRun],
    reference: dict[str, Completion],
    figures: Figures,
) -> None:
    """The stock decode recomputes exactly one prompt token, and vLLM's scheduler pads such a
    step with k placeholder drafts it then rejects (docs/design.md, "MTP acceptance through the
    hand-off"): per request one draft round more than one engine's, nothing accepted in it, the
    same tokens accepted otherwise. The answers are one engine's (the reference's)."""
    one_engine = {s.prompt.name: s.drafting for s in fixed_pair(K).one_engine}
    figures.notes.setdefault("acceptance", {})[f"stock-k{K}"] = drafting_of(
        stock_pair.served
    ).summary()
    for one in stock_pair.served:
        alone = one_engine[one.prompt.name]
        assert one.drafting is not None and alone is not None
        assert one.drafting.drafts == alone.drafts + 1, one.prompt.name
        assert one.drafting.draft_tokens == alone.draft_tokens + K, one.prompt.name
        assert one.drafting.accepted_per_position == alone.accepted_per_position, one.prompt.name
        assert one.completion.token_ids == reference[one.prompt.name].token_ids, one.prompt.name


def test_a_fixed_prefill_with_a_stock_decode_gives_wrong_answers(
    fleet: Fleet,
    workdir: Path,
    model: Path,
    prompts: list[Prompt],
    wirings: Callable[[int], dict[str, EngineWiring]],
    stock_pair: StockRun,
    reference: dict[str, Completion],
    figures: Figures,
) -> None:
    """The decode loads N tokens of KV while the prefill computed N - 2 and ships the blocks of
    N - 5: a list a block short (vLLM answers HTTP 500), or positions nobody wrote. The output
    comparison must see it (else it could not see a wrong backoff either)."""
    served = served_through(
        fleet,
        workdir,
        model,
        prompts,
        {
            "prefill": (f"prefill-k{K}", wirings(K)["prefill"], True),
            "decode": (stock_name("decode"), stock_pair.wiring["decode"], False),
        },
    )
    outcome = {}
    for one in served:
        if one.completion.status != 200:
            outcome[one.prompt.name] = f"HTTP {one.completion.status}: {one.completion.error}"
        elif one.completion.token_ids == reference[one.prompt.name].token_ids:
            outcome[one.prompt.name] = "identical"
        else:
            assert one.completion.token_ids is not None
            want = reference[one.prompt.name].token_ids
            assert want is not None
            got = one.completion.token_ids
            # Same length (ignore_eos, max_tokens), so a differing pair exists.
            first = next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
            outcome[one.prompt.name] = f"diverges at output token {first}"
    figures.notes["fixed_prefill_stock_decode"] = outcome
    wrong = [name for name, result in outcome.items() if result != "identical"]
    assert len(wrong) > len(outcome) // 2, outcome

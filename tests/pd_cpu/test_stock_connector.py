"""Discrimination: the same setup with vLLM's stock `MooncakeConnector` shows no backoff, and a
fixed prefill paired with a stock decode gives answers the comparison with one engine rejects.

k=3 on the 3-module checkpoint: the fixed pair backs off 2 tokens (test_pd_pair.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from fleet import (
    Completion,
    Figures,
    Fleet,
    Prompt,
    Served,
    counts_since,
    handoff_counts,
    serve_all,
    start_router,
)
from tier import MAX_TOKENS, launch, stock_wiring
from wiring import EngineWiring

K = 3


def served_through(
    fleet: Fleet,
    workdir: Path,
    model: Path,
    prompts: list[Prompt],
    pair: dict[str, tuple[str, EngineWiring, bool]],
    handoff: dict[str, float] | None = None,
) -> list[Served]:
    """Serve every prompt through a router in front of `pair` (role -> name, wiring, launcher);
    the decode's hand-off and drafting counters over the run go into `handoff` when given."""
    launches = [launch(name, wiring, via_launcher=v) for name, wiring, v in pair.values()]
    prefill, decode = fleet.acquire(launches)
    router_name = "router-" + "+".join(name for name, _, _ in pair.values())
    router = start_router(pair["prefill"][1], pair["decode"][1], workdir, router_name)
    try:
        before = handoff_counts(decode)
        served = serve_all(router.url, model, prompts, MAX_TOKENS, prefill=prefill, decode=decode)
        if handoff is not None:
            handoff.update(counts_since(handoff_counts(decode), before))
        return served
    finally:
        router.process.stop()
        fleet.release([one.name for one in launches])


@pytest.fixture(scope="module")
def stock_decode(wirings: Callable[[int], dict[str, EngineWiring]]) -> EngineWiring:
    return stock_wiring(wirings(K)["decode"])


def test_stock_connectors_on_both_sides_back_off_nothing(
    fleet: Fleet,
    workdir: Path,
    model: Path,
    prompts: list[Prompt],
    wirings: Callable[[int], dict[str, EngineWiring]],
    stock_decode: EngineWiring,
    reference: dict[str, Completion],
    figures: Figures,
) -> None:
    stock_prefill = stock_wiring(wirings(K)["prefill"])
    handoff: dict[str, float] = {}
    served = served_through(
        fleet,
        workdir,
        model,
        prompts,
        {
            "prefill": (f"stock-prefill-k{K}", stock_prefill, False),
            "decode": (f"stock-decode-k{K}", stock_decode, False),
        },
        handoff,
    )
    # Beside the fixed pair's (figures "handoff"): acceptance on the tiny model, for the record.
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


def test_a_fixed_prefill_with_a_stock_decode_gives_wrong_answers(
    fleet: Fleet,
    workdir: Path,
    model: Path,
    prompts: list[Prompt],
    wirings: Callable[[int], dict[str, EngineWiring]],
    stock_decode: EngineWiring,
    reference: dict[str, Completion],
    figures: Figures,
) -> None:
    """The decode loads N tokens of KV while the prefill computed N - 2: the last two positions
    are blocks nobody wrote. The output comparison must see it (else it could not see a wrong
    backoff either)."""
    served = served_through(
        fleet,
        workdir,
        model,
        prompts,
        {
            "prefill": (f"prefill-k{K}", wirings(K)["prefill"], True),
            "decode": (f"stock-decode-k{K}", stock_decode, False),
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

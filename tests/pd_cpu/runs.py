"""The tier's serving runs, each made once per session and read by several test modules: the
fixed pair per k (with one engine's acceptance measured on its prefill), and the stock pair.

Engines come from the session's Fleet, so a later run reuses what an earlier one left running.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fleet import (
    Figures,
    Fleet,
    Prompt,
    Served,
    counts_since,
    drafting_of,
    fresh_prompts,
    handoff_counts,
    serve_all,
    start_router,
    transfer_durations_ms,
)
from tier import MAX_TOKENS, PROMPT_LENGTHS, fixed_launches, launch, stock_wiring
from wiring import EngineWiring

STOCK_K = 3
"""The stock pair's numSpeculativeTokens: the fixed k=3 pair's engines with vLLM's connector."""


@dataclass(frozen=True)
class PairRun:
    k: int
    backoff: int
    """The derived backoff: lookahead - 1 with a 3-module checkpoint."""
    refresh: int
    """Tokens the fixed decode recomputes beyond the backoff (connector.drafter_refresh)."""
    wiring: dict[str, EngineWiring]
    served: list[Served]
    """The tier's prompts through the router; drafting and scrapes are the decode's."""
    one_engine: list[Served]
    """Fresh prompts of the same lengths, asked of the prefill engine directly (no P/D)."""
    launcher_lines: dict[str, list[str]]
    transfers_ms: list[float]
    handoff: dict[str, float]
    """The decode's hand-off and drafting counters over the run (fleet.HANDOFF_SERIES)."""


def run_fixed_pair(
    k: int,
    *,
    fleet: Fleet,
    model: Path,
    prompts: list[Prompt],
    vocab: int,
    figures: Figures,
    workdir: Path,
    wirings: Callable[[int], dict[str, EngineWiring]],
) -> PairRun:
    wiring = wirings(k)
    launches = fixed_launches(k, wiring)
    prefill, decode = fleet.acquire(launches)
    router = start_router(wiring["prefill"], wiring["decode"], workdir, f"router-k{k}")
    try:
        # One engine first, on prompts of its own: the prefill's prefix cache then holds
        # nothing the pair's prompts could hit.
        one_engine = serve_all(
            prefill.url,
            model,
            fresh_prompts(f"one engine k{k}", PROMPT_LENGTHS, vocab),
            MAX_TOKENS,
            drafter=prefill,
        )
        before = handoff_counts(decode)
        served = serve_all(router.url, model, prompts, MAX_TOKENS, prefill=prefill, decode=decode)
        handoff = counts_since(handoff_counts(decode), before)
        for one, engine in zip(launches, (prefill, decode), strict=True):
            figures.note_rss(one.name, engine)
    finally:
        router.process.stop()
        fleet.release([one.name for one in launches])
    transfers = transfer_durations_ms(prefill)
    figures.request_seconds[f"pd-k{k}"] = [round(s.completion.seconds, 3) for s in served]
    figures.transfer_ms[f"pd-k{k}"] = transfers
    figures.notes.setdefault("handoff", {})[f"k{k}"] = handoff
    figures.notes.setdefault("acceptance", {})[f"k{k}"] = {
        "one engine": drafting_of(one_engine).summary(),
        "fixed pair": drafting_of(served).summary(),
        "per position, one engine": list(drafting_of(one_engine).accepted_per_position),
    }
    figures.notes.setdefault("substitutions", {})[f"k{k}"] = {
        role: list(wiring[role].substituted) for role in wiring
    }
    backoff = k - 1
    return PairRun(
        k=k,
        backoff=backoff,
        refresh=max(k, 2 - backoff),
        wiring=wiring,
        served=served,
        one_engine=one_engine,
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


@dataclass(frozen=True)
class StockRun:
    """vLLM's `MooncakeConnector` on both sides of the k=3 pair."""

    wiring: dict[str, EngineWiring]
    """The stock engines (their own ports): `launch(stock_name(role), ...)` starts them."""
    served: list[Served]
    handoff: dict[str, float]


def stock_name(role: str) -> str:
    return f"stock-{role}-k{STOCK_K}"


def run_stock_pair(
    *,
    fleet: Fleet,
    model: Path,
    prompts: list[Prompt],
    workdir: Path,
    wirings: Callable[[int], dict[str, EngineWiring]],
) -> StockRun:
    stock = {role: stock_wiring(wirings(STOCK_K)[role]) for role in ("prefill", "decode")}
    pair = {role: launch(stock_name(role), stock[role], via_launcher=False) for role in stock}
    prefill, decode = fleet.acquire(list(pair.values()))
    router = start_router(stock["prefill"], stock["decode"], workdir, f"router-stock-k{STOCK_K}")
    try:
        before = handoff_counts(decode)
        served = serve_all(router.url, model, prompts, MAX_TOKENS, prefill=prefill, decode=decode)
        handoff = counts_since(handoff_counts(decode), before)
    finally:
        router.process.stop()
        fleet.release([one.name for one in pair.values()])
    return StockRun(wiring=stock, served=served, handoff=handoff)

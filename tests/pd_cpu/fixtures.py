"""The tier's shared fixtures (conftest.py imports them only where the tier's venv is there)."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import lookback_mimo
import pytest
from fleet import Completion, Figures, Fleet, Prompt, serve_all
from lookback_mimo import LookbackMimo
from runs import PairRun, StockRun, run_fixed_pair, run_stock_pair
from tier import (
    MAX_TOKENS,
    PROMPT_LENGTHS,
    PROMPT_SEED,
    TIER_DISTANCES,
    reference_launch,
    render_pair,
)
from wiring import EngineWiring

CHECKPOINT = LookbackMimo(TIER_DISTANCES)
VOCAB = CHECKPOINT.shape.vocab_size - 1
"""Prompt tokens are drawn below the end-of-text token (the last id)."""

FIGURES = Figures()
"""Filled by the tests, printed and written by conftest's terminal summary."""


@pytest.fixture(scope="session")
def figures() -> Figures:
    return FIGURES


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pd-cpu")


@pytest.fixture(scope="session")
def model(workdir: Path) -> Path:
    assert CHECKPOINT.shape.mtp_modules == 3  # tier.MTP_MODULES, what the PDDeployment declares
    return lookback_mimo.write_checkpoint(workdir / "lookback-mimo", CHECKPOINT)


@pytest.fixture(scope="session")
def prompts() -> list[Prompt]:
    rng = random.Random(PROMPT_SEED)
    return [
        Prompt(f"len{n}", tuple(rng.randrange(VOCAB) for _ in range(n))) for n in PROMPT_LENGTHS
    ]


@pytest.fixture(scope="session")
def fleet(workdir: Path, figures: Figures) -> Iterator[Fleet]:
    engines = Fleet(workdir, figures)
    yield engines
    engines.close()


@pytest.fixture(scope="session")
def reference(
    fleet: Fleet,
    model: Path,
    prompts: list[Prompt],
    figures: Figures,
    wirings: Callable[[int], dict[str, EngineWiring]],
) -> dict[str, Completion]:
    """The reference engine's greedy completion of every prompt (the engine is then released)."""
    launch = reference_launch(wirings(3)["prefill"])
    (engine,) = fleet.acquire([launch])
    try:
        served = serve_all(engine.url, model, prompts, MAX_TOKENS)
    finally:
        fleet.release([launch.name])
    for one in served:
        assert one.completion.status == 200, one.completion.error
        assert one.completion.token_ids is not None
        assert len(one.completion.token_ids) == MAX_TOKENS
    figures.request_seconds["reference"] = [round(s.completion.seconds, 3) for s in served]
    return {s.prompt.name: s.completion for s in served}


@pytest.fixture(scope="session")
def wirings(model: Path) -> Callable[[int], dict[str, EngineWiring]]:
    """`pdmtp render` per numSpeculativeTokens, once: engines reused across modules keep their
    ports."""
    return functools.cache(lambda k: render_pair(model, k))


@pytest.fixture(scope="session")
def fixed_pair(
    fleet: Fleet,
    model: Path,
    prompts: list[Prompt],
    figures: Figures,
    workdir: Path,
    reference: dict[str, Completion],  # the reference runs (and is released) first
    wirings: Callable[[int], dict[str, EngineWiring]],
) -> Callable[[int], PairRun]:
    """The fixed pair's run per k, made on first use (runs.run_fixed_pair)."""
    return functools.cache(
        lambda k: run_fixed_pair(
            k,
            fleet=fleet,
            model=model,
            prompts=prompts,
            vocab=VOCAB,
            figures=figures,
            workdir=workdir,
            wirings=wirings,
        )
    )


@pytest.fixture(scope="session")
def stock_pair(
    fleet: Fleet,
    model: Path,
    prompts: list[Prompt],
    workdir: Path,
    wirings: Callable[[int], dict[str, EngineWiring]],
) -> StockRun:
    return run_stock_pair(
        fleet=fleet, model=model, prompts=prompts, workdir=workdir, wirings=wirings
    )

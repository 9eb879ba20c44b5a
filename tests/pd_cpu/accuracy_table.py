"""The accuracy table of docs/benchmarks.md: MTP acceptance on one engine and on every pairing of
the fixed and the stock Mooncake connector, over drafter distances, k and output lengths.

    make pd-cpu-accuracy                     # every case: ~80 min on two shared cores
    make pd-cpu-accuracy ACCURACY_ARGS="--distance 2 --k 3"

For each drafter distance d (lookback_mimo.py: the drafter reads the token d positions back, and
one engine accepts every draft) and each k, it starts four engines the way the tier does (the
fixed prefill and decode through the engine image's launcher with `pdmtp render`'s args, the
stock ones with vLLM's `MooncakeConnector` in their place) and serves fresh prompts through five
paths: one engine (the fixed prefill, asked directly), the fixed pair, the stock pair, a stock
prefill with a fixed decode and a fixed prefill with a stock decode, each behind the real
router. Every answer is checked against the checkpoint's own greedy continuation, computed from
its tensors (lookback_mimo.continuation).

Writes the table (Markdown) to stdout and every figure, per request, to --json. Runs inside the
CPU P/D tier's venv and a loopback-only network namespace, as the tier does (the Makefile target
does both).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

TIER_DIR = Path(__file__).resolve().parent
for _path in (TIER_DIR, TIER_DIR.parents[1] / "hack" / "lib"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import lookback_mimo  # noqa: E402
import torch  # noqa: E402
from acceptance import Drafting  # noqa: E402
from fleet import (  # noqa: E402
    Figures,
    Fleet,
    counts_since,
    drafting_of,
    fresh_prompts,
    handoff_counts,
    serve_all,
    start_router,
)
from processes import Engine  # noqa: E402
from tier import launch, render_pair, stock_wiring  # noqa: E402

DISTANCES = (0, 1, 2, 3, 40)
"""Its own position, one and two back, backoff + 1 for k = 3 (and k = 2's too), and far back."""
KS = (1, 2, 3)
OUTPUTS = {"short": 32, "long": 96}
"""Output tokens: 96 reaches the entry a drafter reading 40 back meets ~40 tokens in."""
LENGTHS = (60, 97, 127, 128, 129, 130, 131, 133, 200, 257)
"""Prompt lengths: all longer than the farthest distance + 1, and the prompts whose backoff or
recomputed tail ends on or just past the first block boundary (block size 128)."""
PATHS = ("one engine", "fixed pair", "stock pair", "stock P + fixed D", "fixed P + stock D")
RUN_ORDER = ("one engine", "fixed pair", "stock P + fixed D", "stock pair", "fixed P + stock D")
"""Three engines alive at most, each started once: the fixed decode goes before the stock one."""


@dataclass(frozen=True)
class PathResult:
    distance: int
    k: int
    output: str
    path: str
    drafting: Drafting
    per_request: list[Drafting]
    wrong: list[str]
    """Prompts answered, but not with the checkpoint's greedy continuation."""
    failed: dict[str, str]
    handoff: dict[str, float]


def run_case(
    distance: int,
    k: int,
    workdir: Path,
    paths: Sequence[str] = PATHS,
) -> list[PathResult]:
    """Every path of `paths` for the checkpoint whose drafter reads `distance` back, at `k`."""
    spec = lookback_mimo.LookbackMimo((distance,))
    model = workdir / f"lookback-d{distance}"
    if not (model / "model.safetensors").exists():
        lookback_mimo.write_checkpoint(model, spec)
    tensors = lookback_mimo.checkpoint_tensors(spec)
    vocab = spec.shape.vocab_size - 1  # never the end-of-text token (the last id)
    fixed = render_pair(model, k)
    wiring = {
        "fixed prefill": fixed["prefill"],
        "fixed decode": fixed["decode"],
        "stock prefill": stock_wiring(fixed["prefill"]),
        "stock decode": stock_wiring(fixed["decode"]),
    }
    fleet = Fleet(workdir, Figures(), max_alive=3)
    name = {role: f"d{distance}-k{k}-{role.replace(' ', '-')}" for role in wiring}

    def engines(*roles: str) -> list[Engine]:
        launches = [
            launch(name[role], wiring[role], via_launcher=role.startswith("fixed"))
            for role in roles
        ]
        got = fleet.acquire(launches)
        fleet.release([one.name for one in launches])
        return got

    pairs = {
        "fixed pair": ("fixed prefill", "fixed decode"),
        "stock P + fixed D": ("stock prefill", "fixed decode"),
        "stock pair": ("stock prefill", "stock decode"),
        "fixed P + stock D": ("fixed prefill", "stock decode"),
    }
    results: list[PathResult] = []
    try:
        for path in (p for p in RUN_ORDER if p in paths):
            router = None
            if path == "one engine":
                (prefill,) = engines("fixed prefill")
                url, drafter, decode = prefill.url, prefill, None
            else:
                p_role, d_role = pairs[path]
                if d_role == "stock decode":
                    fleet.stop(name["fixed decode"])  # three engines at most: done with it
                prefill, decode = engines(p_role, d_role)
                router = start_router(wiring[p_role], wiring[d_role], workdir, f"router-{path}")
                url, drafter = router.url, decode
            try:
                for output, max_tokens in OUTPUTS.items():
                    prompts = fresh_prompts(f"d{distance} k{k} {path} {output}", LENGTHS, vocab)
                    before = handoff_counts(decode) if decode is not None else {}
                    served = serve_all(url, model, prompts, max_tokens, drafter=drafter)
                    failed = {
                        s.prompt.name: f"HTTP {s.completion.status}: {s.completion.error}"
                        for s in served
                        if s.completion.status != 200
                    }
                    wrong = [
                        s.prompt.name
                        for s in served
                        if s.prompt.name not in failed
                        and s.completion.token_ids
                        != lookback_mimo.continuation(
                            tensors, spec.shape, s.prompt.token_ids, max_tokens
                        )
                    ]
                    result = PathResult(
                        distance=distance,
                        k=k,
                        output=output,
                        path=path,
                        drafting=drafting_of(served),
                        per_request=[s.drafting for s in served if s.drafting is not None],
                        wrong=wrong,
                        failed=failed,
                        handoff=(
                            counts_since(handoff_counts(decode), before)
                            if decode is not None
                            else {}
                        ),
                    )
                    results.append(result)
                    print(
                        f"d={distance} k={k} {output:5} {path:18} {result.drafting.summary():22} "
                        f"per position {list(result.drafting.accepted_per_position)} "
                        f"wrong {len(wrong)} failed {len(failed)}",
                        file=sys.stderr,
                        flush=True,
                    )
            finally:
                if router is not None:
                    router.process.stop()
    finally:
        fleet.close()
    return results


def cell(result: PathResult) -> str:
    text = result.drafting.summary()
    if result.failed:
        text += f", {len(result.failed)} failed"
    if result.wrong:
        text += f", {len(result.wrong)} wrong"
    return text


def table(results: Sequence[PathResult]) -> str:
    """One row per (d, k, output length), one column per path."""
    by_key = {(r.distance, r.k, r.output, r.path): r for r in results}
    rows = sorted(
        {(r.distance, r.k, r.output) for r in results},
        key=lambda row: (row[0], row[1], list(OUTPUTS).index(row[2])),
    )
    lines = [
        "| d | k | output tokens | " + " | ".join(PATHS) + " |",
        "|---|---|---|" + "---|" * len(PATHS),
    ]
    for distance, k, output in rows:
        cells = [
            cell(by_key[key]) if (key := (distance, k, output, path)) in by_key else "-"
            for path in PATHS
        ]
        lines.append(f"| {distance} | {k} | {OUTPUTS[output]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--distance", type=int, action="append", help="default: all")
    parser.add_argument("--k", type=int, action="append", help="default: 1, 2, 3")
    parser.add_argument("--path", action="append", choices=PATHS, help="default: all")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/pdmtp-pd-cpu-accuracy"))
    parser.add_argument("--json", type=Path, help="every figure, per request")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the reference continuations: leave the cores to the engines
    args.workdir.mkdir(parents=True, exist_ok=True)
    results: list[PathResult] = []
    started = time.monotonic()
    for distance in args.distance or DISTANCES:
        for k in args.k or KS:
            results += run_case(distance, k, args.workdir, args.path or PATHS)
            if args.json:
                args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    print(table(results))
    print(f"\n{len(results)} measurements in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Experiment: is vLLM's one-token spec-decode padding the stock decode's empty draft round?

    make pd-cpu-padding-experiment            # ~10 min on two shared cores; JSON on stdout

vLLM's scheduler (`Scheduler.schedule`, 0.32.0 and 0.33.0: "Pad new decode requests to uniform
spec decoding size") gives a newly admitted request with exactly one token left to compute, and
some computed already, k placeholder drafts (-1) that the rejection sampler rejects and the
spec-decode metrics count as a draft round. A stock Mooncake decode recomputes exactly the last
prompt token. The experiment serves the stock k=3 pair on the lookback checkpoint with d=0 (its
drafter reads only its own position, so no KV entry of the prefill's can cost a draft) twice:
with the decode as it is, and with a decode whose scheduler has that one condition switched off
(its source patched at import by a sitecustomize written here, ahead of the tier's shim). It also
asks one engine the same prompt twice, to show what a prefix-cache hit leaves to compute there.

Not part of the tier: it patches vLLM. docs/design.md, "MTP acceptance through the hand-off",
quotes its figures.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

TIER_DIR = Path(__file__).resolve().parent
for _path in (TIER_DIR, TIER_DIR.parents[1] / "hack" / "lib"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import lookback_mimo  # noqa: E402
import processes  # noqa: E402
import torch  # noqa: E402
from fleet import Figures, Fleet, drafting_of, fresh_prompts, serve_all, start_router  # noqa: E402
from tier import launch, render_pair, stock_wiring  # noqa: E402

K = 3
LENGTHS = (60, 97, 127, 128, 129, 130, 131, 133, 200, 257)
MAX_TOKENS = 32
SWITCH = "PDMTP_EXPERIMENT_NO_SPEC_PADDING"
OFF = "experiment: vLLM's one-token spec-decode padding is off"
PADDING_CONDITION = "and num_new_tokens == 1\n                        and not prefill_scheduled"
"""The padding's condition in vllm/v1/core/sched/scheduler.py (0.32.0), as indented there."""

SHIM = f"""
import importlib.abc, importlib.machinery, importlib.util, os, sys
_tier_shim = {str(processes.SHIM_DIR / "sitecustomize.py")!r}
exec(compile(open(_tier_shim).read(), _tier_shim, "exec"))
if os.environ.get({SWITCH!r}) == "1":
    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname != "vllm.v1.core.sched.scheduler":
                return None
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            source = open(spec.origin).read()
            assert source.count({PADDING_CONDITION!r}) == 1, "the padding condition moved"
            patched = source.replace({PADDING_CONDITION!r}, {PADDING_CONDITION!r} + " and False")
            class _Loader(importlib.abc.SourceLoader):
                def get_filename(self, name):
                    return spec.origin
                def get_data(self, p):
                    return patched.encode() if p == spec.origin else open(p, "rb").read()
            return importlib.util.spec_from_file_location(fullname, spec.origin, loader=_Loader())
    sys.meta_path.insert(0, _Finder())
    print({OFF!r}, file=sys.stderr)
"""


def main() -> int:
    workdir = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/pdmtp-padding-experiment")
    (workdir / "shim").mkdir(parents=True, exist_ok=True)
    (workdir / "shim" / "sitecustomize.py").write_text(SHIM)
    processes.SHIM_DIR = workdir / "shim"  # every engine here starts with it; the switch decides
    torch.set_num_threads(1)
    spec = lookback_mimo.LookbackMimo((0,))
    model = lookback_mimo.write_checkpoint(workdir / "lookback-d0", spec)
    vocab = spec.shape.vocab_size - 1
    fixed = render_pair(model, K)
    prefill_wiring = stock_wiring(fixed["prefill"])
    decodes = {"as is": stock_wiring(fixed["decode"]), "padding off": stock_wiring(fixed["decode"])}
    launches = [launch("stock-prefill", prefill_wiring, via_launcher=False)]
    for name, wiring in decodes.items():
        one = launch(f"stock-decode-{name.replace(' ', '-')}", wiring, via_launcher=False)
        if name == "padding off":
            one = replace(one, host_env={**one.host_env, SWITCH: "1"})
        launches.append(one)
    fleet = Fleet(workdir, Figures(), max_alive=3)
    report: dict[str, Any] = {}
    try:
        prefill, *decode_engines = fleet.acquire(launches)
        switched = [OFF in e.process.log(tail=10**7) for e in decode_engines]
        report["decodes that logged the switch"] = switched
        alone = serve_all(
            prefill.url,
            model,
            fresh_prompts("one engine", LENGTHS, vocab),
            MAX_TOKENS,
            drafter=prefill,
        )
        report["one engine"] = [asdict(s.drafting) for s in alone if s.drafting]
        twice = fresh_prompts("twice", (257,), vocab)
        first = serve_all(prefill.url, model, twice, MAX_TOKENS, drafter=prefill)
        before = prefill.prompt_tokens_by_source()
        second = serve_all(prefill.url, model, twice, MAX_TOKENS, drafter=prefill)
        after = prefill.prompt_tokens_by_source()
        report["one engine, a 257-token prompt twice"] = {
            "first": first[0].drafting and asdict(first[0].drafting),
            "second": second[0].drafting and asdict(second[0].drafting),
            "second's prompt tokens": {s: after[s] - before.get(s, 0.0) for s in after},
        }
        tensors = lookback_mimo.checkpoint_tensors(spec)
        for (name, wiring), engine in zip(decodes.items(), decode_engines, strict=True):
            router = start_router(
                prefill_wiring, wiring, workdir, f"router-{name.replace(' ', '-')}"
            )
            try:
                served = serve_all(
                    router.url,
                    model,
                    fresh_prompts(name, LENGTHS, vocab),
                    MAX_TOKENS,
                    prefill=prefill,
                    decode=engine,
                )
            finally:
                router.process.stop()
            report[f"stock pair, decode {name}"] = {
                "total": drafting_of(served).summary(),
                "rounds per request": [s.drafting.drafts for s in served if s.drafting],
                "decode prompt tokens": [
                    s.accounting and dict(s.accounting.decode) for s in served
                ],
                "answers equal the checkpoint's": sum(
                    s.completion.token_ids
                    == lookback_mimo.continuation(
                        tensors, spec.shape, s.prompt.token_ids, MAX_TOKENS
                    )
                    for s in served
                ),
            }
        report["one engine total"] = drafting_of(alone).summary()
    finally:
        fleet.close()
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The verdict's simulation sweep: the table of docs/benchmarks.md, "The verdict's statistics,
simulated" (issue 50).

    .venv/bin/python hack/verdict-sweep.py [--rollouts N] [--seed S] > table.md

For every workload mix, k and background failure rate: the share of healthy rollouts failed at
some judgement within 100, 300, 1,000, 3,000 and 10,000 requests (judged at every scrape, the
reference serving beside the candidate); the requests a healthy candidate needs to be Verified;
the share of candidates whose accepted tokens per draft dropped 15 % that are Failed before they
are Verified, and the requests by which 95 % are; for each background, the requests by which 95 %
of candidates failing pulls at ten times the serving revision's rate are Failed. Then the same
for other traffic shapes (a canary's share, thin and heavy traffic, requests longer than a
window). Numbers depend only on the seed: the same command prints the same table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent / "lib"))

import verdict_sim as vs
from pdmtp.core.verification.verdict import Rules

LENGTHS = (100, 300, 1_000, 3_000, 10_000)
BACKGROUNDS = (0.0, 1 / 5_000, 1 / 500)
KS = (1, 3, 5)


def _fraction(x: float) -> str:
    return "0" if x == 0 else f"1/{round(1 / x):,}"


def _requests(x: float) -> str:
    return "never" if not np.isfinite(x) else f"{x:,.0f}"


def _share(x: float) -> str:
    return f"{100 * x:.1f} %"


def healthy_and_dropped(args: argparse.Namespace, rules: Rules, out: list[str]) -> float:
    rng = np.random.default_rng(args.seed)
    worst = 0.0
    out += [
        "| mix | k | background | false rollbacks within 100 / 300 / 1,000 / 3,000 / 10,000 "
        "requests | Verified by (median / 95 %) | 15 % drop Failed first | by (95 %) |",
        "|---|---|---|---|---|---|---|",
    ]
    for mix in vs.MIXES:
        for k in KS:
            for background in BACKGROUNDS:
                dropped = vs.run(
                    rng,
                    args.rollouts,
                    3_000,
                    mix,
                    k,
                    rules,
                    background=background,
                    acceptance_factor=0.85,
                )
                caught = dropped.caught()
                run = vs.run(rng, args.rollouts, LENGTHS[-1], mix, k, rules, background=background)
                false = [run.failed_within(n) for n in LENGTHS]
                worst = max(worst, *false)
                verified = run.verified_at()
                out.append(
                    f"| {mix.name} | {k} | {_fraction(background)} | "
                    + " / ".join(_share(x) for x in false)
                    + f" | {_requests(vs.quantile(verified, 0.5))} / "
                    f"{_requests(vs.quantile(verified, 0.95))} | "
                    f"{_share(float(np.isfinite(caught).mean()))} | "
                    f"{_requests(vs.quantile(caught, 0.95))} |"
                )
                print(out[-1], file=sys.stderr, flush=True)
    return worst


def failures(args: argparse.Namespace, rules: Rules, out: list[str]) -> None:
    rng = np.random.default_rng(args.seed + 1)
    out += [
        "",
        "| background (the serving revision's rate) | candidate's rate | Failed within "
        "(95 % of rollouts) | Failed at all within the horizon | horizon |",
        "|---|---|---|---|---|",
    ]
    mix = vs.MIXES[2]
    for background, rate, horizon in (
        (0.0, 1 / 500, 12_000),
        (1 / 5_000, 1 / 500, 40_000),
        (1 / 500, 1 / 50, 6_000),
    ):
        run = vs.run(
            rng, args.rollouts, horizon, mix, 3, rules, background=background, failure_rate=rate
        )
        failed = vs.first(run.outcome == vs.FAILED)
        windows = run.outcome.shape[1]
        at = np.take_along_axis(run.requests, np.minimum(failed, windows - 1)[:, None], 1)[:, 0]
        at = np.where(failed < windows, at, np.inf)
        out.append(
            f"| {_fraction(background)} | {_fraction(rate)} | "
            f"{_requests(vs.quantile(at, 0.95))} | {_share(float(np.isfinite(at).mean()))} | "
            f"{horizon:,} |"
        )
        print(out[-1], file=sys.stderr, flush=True)


def shapes(args: argparse.Namespace, rules: Rules, out: list[str]) -> None:
    rng = np.random.default_rng(args.seed + 2)
    out += [
        "",
        "| traffic (mix 0.55/0.85, k 3, background 1/500) | false rollbacks within 1,000 / "
        "10,000 | Verified by (median) | 15 % drop Failed first | by (95 %) |",
        "|---|---|---|---|---|",
    ]
    for name, traffic in (
        ("2 + 2 decodes, 8 requests a pod and window (the table above)", vs.Traffic()),
        ("a canary: 1 new decode beside 3", vs.Traffic(candidate_pods=1, reference_pods=3)),
        ("thin: 2 requests a pod and window", vs.Traffic(per_window=2.0)),
        ("heavy: 40 requests a pod and window", vs.Traffic(per_window=40.0)),
        (
            "long requests: a window is 100 steps (512 tokens span up to 4 windows)",
            vs.Traffic(steps_per_window=100.0),
        ),
    ):
        run = vs.run(rng, args.rollouts, 10_000, vs.MIXES[0], 3, rules, traffic, 1 / 500)
        dropped = vs.run(
            rng, args.rollouts, 3_000, vs.MIXES[0], 3, rules, traffic, 1 / 500, None, 0.85
        )
        caught = dropped.caught()
        out.append(
            f"| {name} | {_share(run.failed_within(1_000))} / {_share(run.failed_within(10_000))} "
            f"| {_requests(vs.quantile(run.verified_at(), 0.5))} | "
            f"{_share(float(np.isfinite(caught).mean()))} | "
            f"{_requests(vs.quantile(caught, 0.95))} |"
        )
        print(out[-1], file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=2_000)
    parser.add_argument("--seed", type=int, default=50)
    args = parser.parse_args()
    rules = Rules(expected_backoff=None)  # the defaults: 1 % false rollbacks, a 10 % drop
    started = time.monotonic()
    out: list[str] = []
    worst = healthy_and_dropped(args, rules, out)
    failures(args, rules, out)
    shapes(args, rules, out)
    seconds = time.monotonic() - started
    out += [
        "",
        f"{args.rollouts:,} rollouts per row, seed {args.seed}; worst false-rollback share in "
        f"the first table {_share(worst)}; {seconds:.0f} s.",
    ]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

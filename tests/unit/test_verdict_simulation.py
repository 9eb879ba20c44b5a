"""The verdict over whole simulated rollouts (hack/lib/verdict_sim.py): mixed traffic split over
the candidate's and the serving revision's decode pods, counters growing per scrape window, the
verdict taken at every scrape. The unit tier's share of the proof, in cells of the sweep
(docs/benchmarks.md, "The verdict's statistics, simulated", made by hack/verdict-sweep.py):
the vectorised judgement is the real `judge`'s; healthy rollouts (1,000 a cell, every workload at
k = 3 and the hardest at k = 5) are rarely failed; a 15 % drop and ten times the failure rate are
caught; and a judge that assumes its variance instead of measuring it fails the same check. Unit
tier, ~8 s on one worker of a quiet machine (seeded: the same every run).
"""

from __future__ import annotations

import numpy as np
import pytest
import verdict_sim as vs
from pdmtp.core.verification import statistics
from pdmtp.core.verification.statistics import RatioSample
from pdmtp.core.verification.verdict import Rules

RULES = Rules(expected_backoff=None)
HARDEST = vs.MIXES[0]
"""Half the requests at a per-token acceptance of 0.55, half at 0.85: the old judge (one ratio
over the first 8 requests) failed about 40 % of healthy rollouts here (issue 50)."""


def test_the_vectorised_judgement_is_the_verdicts() -> None:
    """Every fourth judgement of 16 rollouts, healthy, failing pulls or drafting worse, through
    the real `judge` on the simulated pods' windows: the same outcome each time."""
    rng = np.random.default_rng(7)
    traffic = vs.Traffic()
    windows = vs.windows_for(600, traffic)
    seen: set[int] = set()
    for failing, factor in ((0.0, 1.0), (1 / 30, 1.0), (0.0, 0.8), (1 / 500, 0.9)):
        mine = vs.revision(rng, 4, windows, HARDEST, 3, 2, traffic, failing, failing / 2, factor)
        theirs = vs.revision(rng, 4, windows, HARDEST, 3, 2, traffic, 1 / 500, 1 / 500)
        fast = vs.decide(vs.cumulative(mine), vs.cumulative(theirs), RULES)
        seen |= {int(x) for x in np.unique(fast)}
        for rollout in range(4):
            for window in range(0, windows, 4):
                real = vs.judge_with_pdmtp(mine, theirs, rollout, window, RULES)
                assert fast[rollout, window] == vs.OUTCOMES[real], (
                    failing,
                    factor,
                    rollout,
                    window,
                )
    assert seen == {vs.FAILED, vs.PENDING, vs.VERIFIED}


CELLS = [(mix, 3) for mix in vs.MIXES] + [(HARDEST, 5)]
"""Every workload at k = 3, and the hardest at k = 5 (the most requests to a verdict)."""


@pytest.mark.parametrize(("mix", "k"), CELLS, ids=[f"{m.name}, k={k}" for m, k in CELLS])
def test_healthy_rollouts_are_rarely_failed_and_soon_verified(mix: vs.Mix, k: int) -> None:
    run = vs.run(np.random.default_rng(50), 1000, 1500, mix, k, RULES, background=1 / 500)
    assert run.failed_within(1500) <= 0.01
    verified = run.verified_at()
    assert np.median(verified) <= 500 and np.isfinite(verified).mean() >= 0.9


@pytest.mark.parametrize(("mix", "k"), CELLS, ids=[f"{m.name}, k={k}" for m, k in CELLS])
def test_a_15_percent_drop_is_failed_before_it_is_verified(mix: vs.Mix, k: int) -> None:
    run = vs.run(
        np.random.default_rng(51),
        300,
        1500,
        mix,
        k,
        RULES,
        background=1 / 500,
        acceptance_factor=0.85,
    )
    caught = run.caught()
    assert np.isfinite(caught).mean() >= 0.95 and np.quantile(caught, 0.9) <= 1000


def test_ten_times_the_serving_revisions_failure_rate_is_failed() -> None:
    run = vs.run(
        np.random.default_rng(52),
        300,
        4000,
        vs.MIXES[2],
        1,
        RULES,
        background=1 / 500,
        failure_rate=1 / 50,
    )
    failed = vs.first(run.outcome == vs.FAILED)
    assert (failed < run.outcome.shape[1]).mean() >= 0.95


def test_a_judge_that_assumes_its_variance_fails_this_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The control: the same test with the variance of independent drafts (what a binomial
    model of acceptance would assume) instead of the windows' measured one fails healthy
    rollouts of mixed traffic far more often than 1 %."""

    def assumed(s: RatioSample, scale: float | None = None) -> float:
        return 0.25 / s.drafts

    monkeypatch.setattr(statistics, "relative_variance", assumed)
    run = vs.run(np.random.default_rng(50), 300, 1000, HARDEST, 3, RULES, background=1 / 500)
    assert run.failed_within(1000) > 0.05

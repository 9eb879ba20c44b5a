"""Hypothesis strategies for simulated rollouts: shapes and policies the planner must handle."""

from __future__ import annotations

from hypothesis import strategies as st
from pdmtp.core.rollout.planner import Policy, Target

replicas = st.integers(1, 6)
policies = st.builds(
    Policy,
    max_surge=st.integers(0, 3),
    max_unavailable=st.integers(0, 3),
    drain_seconds=st.integers(0, 6),
).filter(lambda p: p.max_surge + p.max_unavailable > 0)


def targets(revision: str) -> st.SearchStrategy[Target]:
    return st.builds(Target, st.just(revision), replicas, replicas, st.integers(1, 3))

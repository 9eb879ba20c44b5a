"""The one backoff of the operator's retry loops (the API adapter's retried requests, the
reflectors' re-listings, the workers' failed reconciles): exponential, capped, and jittered so
that loops which failed together do not retry in step."""

from __future__ import annotations

import math
import random
from collections.abc import Callable


def backoff(
    attempt: int,
    base: float,
    cap: float = math.inf,
    jitter: float = 0.25,
    rand: Callable[[], float] = random.random,
) -> float:
    """Seconds to pause after failure number `attempt`: `base * 2**attempt`, at most `cap`,
    stretched by up to `jitter` of itself."""
    return min(cap, base * 2.0**attempt) * (1 + jitter * rand())

"""The prefill:decode ratio band: when the two counts leave it, the nearest pair inside it and
inside both roles' min/max.
"""

from __future__ import annotations

import math
from fractions import Fraction

from pdmtp.api.autoscaling import RatioBand, exact

UNREACHABLE = "unreachable within min/max replicas: min/max win"


def keep_ratio(
    band: RatioBand,
    prefill: int,
    decode: int,
    prefill_bounds: tuple[int, int],
    decode_bounds: tuple[int, int],
) -> tuple[int, int, str | None]:
    """The pair within the band and both roles' min/max nearest to (prefill, decode).

    Nearest means: fewest pods taken away from what the roles want, then fewest added, then the
    decode count closest to its own. None inside the band: min/max win and the note says so.
    """
    low, high = exact(band.min), exact(band.max)
    label = f"prefill:decode band [{band.min:g}, {band.max:g}]"
    if low <= Fraction(prefill, decode) <= high:
        return prefill, decode, None
    best: tuple[tuple[int, int, int], int, int] | None = None
    (prefill_min, prefill_max), (decode_min, decode_max) = prefill_bounds, decode_bounds
    # Only decode counts for which some prefill count in [min, max] fits the band.
    first = max(decode_min, math.ceil(prefill_min / high))
    last = min(decode_max, math.floor(prefill_max / low))
    for candidate_decode in range(first, last + 1):
        lowest = max(prefill_min, math.ceil(low * candidate_decode))
        highest = min(prefill_max, math.floor(high * candidate_decode))
        if lowest > highest:
            continue
        candidate_prefill = min(max(prefill, lowest), highest)
        taken = max(0, prefill - candidate_prefill) + max(0, decode - candidate_decode)
        added = max(0, candidate_prefill - prefill) + max(0, candidate_decode - decode)
        key = (taken, added, abs(candidate_decode - decode))
        if best is None or key < best[0]:
            best = (key, candidate_prefill, candidate_decode)
    if best is None:
        return prefill, decode, f"{label} {UNREACHABLE}"
    return best[1], best[2], label

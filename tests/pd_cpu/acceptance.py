"""MTP acceptance as vLLM counts it, on one engine or on a prefill/decode pair's decode: what
fleet.serve_all records per request, the tier's accuracy tests and the full table
(accuracy_table.py, docs/benchmarks.md) read.

vLLM counts on the engine that drafts (a pair's decode): `vllm:spec_decode_num_drafts` (draft
rounds), `..._num_draft_tokens`, `..._num_accepted_tokens` and `..._num_accepted_tokens_per_pos`
(by draft position). A request's figures are the change of these counters over it, so requests
are sent one at a time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from processes import metric_by

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


@dataclass(frozen=True)
class Drafting:
    """What an engine's drafter did over some requests (vLLM's counters)."""

    drafts: float = 0.0
    """Draft rounds: decode steps that verified at least one draft token."""
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_per_position: tuple[float, ...] = ()
    """Accepted tokens at each draft position (0: the first token of a round)."""

    @property
    def per_draft(self) -> float | None:
        """Accepted tokens per draft round, the verdict's acceptance; None without a draft."""
        return self.accepted / self.drafts if self.drafts else None

    def since(self, before: Drafting) -> Drafting:
        width = max(len(self.accepted_per_position), len(before.accepted_per_position))
        after_positions = _padded(self.accepted_per_position, width)
        before_positions = _padded(before.accepted_per_position, width)
        return Drafting(
            drafts=self.drafts - before.drafts,
            draft_tokens=self.draft_tokens - before.draft_tokens,
            accepted=self.accepted - before.accepted,
            accepted_per_position=tuple(
                a - b for a, b in zip(after_positions, before_positions, strict=True)
            ),
        )

    def plus(self, other: Drafting) -> Drafting:
        width = max(len(self.accepted_per_position), len(other.accepted_per_position))
        return Drafting(
            drafts=self.drafts + other.drafts,
            draft_tokens=self.draft_tokens + other.draft_tokens,
            accepted=self.accepted + other.accepted,
            accepted_per_position=tuple(
                a + b
                for a, b in zip(
                    _padded(self.accepted_per_position, width),
                    _padded(other.accepted_per_position, width),
                    strict=True,
                )
            ),
        )

    def summary(self) -> str:
        """`3.00 (960/320)`: accepted tokens per draft round (accepted / rounds)."""
        if not self.drafts:
            return "no draft"
        return f"{self.accepted / self.drafts:.2f} ({self.accepted:g}/{self.drafts:g})"


def _padded(values: tuple[float, ...], width: int) -> tuple[float, ...]:
    return values + (0.0,) * (width - len(values))


def drafting(samples: Mapping[str, float]) -> Drafting:
    """The drafting counters out of one scrape (summed over engine ranks)."""

    def total(name: str) -> float:
        return sum(metric_by(samples, name).values())

    by_position = metric_by(samples, ACCEPTED_PER_POSITION, "position")
    positions = sorted(int(p) for (p,) in by_position if p)
    return Drafting(
        drafts=total(DRAFTS),
        draft_tokens=total(DRAFT_TOKENS),
        accepted=total(ACCEPTED),
        accepted_per_position=tuple(by_position[(str(p),)] for p in positions),
    )

"""The emulated decode's KV hand-off counts and faults, in the names the engine image exports.

The engine image's fixed connector counts, per decode, the requests that pulled a prefill's KV,
the tokens pulled, the tokens recomputed for the MTP backoff and for the drafter refresh, and
the requests served decode-only (`pdmtp_engine.handoff`); vLLM counts failed receives
(`vllm:mooncake_num_failed_recvs`). The emulated decode counts the same, so the operator's
verdict can be proven against emulated pairs, and can be told to misbehave the ways a real pair
does (`Tuning`):

- `pull_failure_rate`: that fraction of pulls fails. What the decode does then is its
  `--kv-transfer-config`'s `kv_load_failure_policy`, as vLLM's scheduler does: `fail` (vLLM's
  default since 0.32) fails the request with a 500; `recompute` has the decode compute the prompt
  itself, so the request still succeeds (without the prefill's KV) and only the counter shows it;
- `decode_only_rate`: that fraction of remote-prefill requests is served with no prefill's KV;
- `fixed_connector: 0`: an engine without the fixed connector: no hand-off counts, no backoff.

Fractions are applied as deterministic credit (every 1/rate-th request), not a random draw, so a
test can count what it asked for. A pull that cannot find its prefill (a stale engine id after a
prefill restart) fails the same way. As the engine image's connector does, a pull is counted when
it starts (`pdmtp:kv_pulled_requests`), so a failed pull is among the pulled requests too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pdmtp_emulator.scheduler import Tuning, label_set

Fault = Literal["fail", "decode_only"]
LoadFailurePolicy = Literal["recompute", "fail"]

COUNTERS = {
    "pulled_requests": ("pdmtp:kv_pulled_requests", "Requests that pulled a prefill's KV."),
    "pulled_tokens": ("pdmtp:kv_pulled_tokens", "Prompt tokens of KV pulled."),
    "backoff_tokens": ("pdmtp:kv_backoff_tokens", "Prompt tokens recomputed for the backoff."),
    "refreshed_tokens": (
        "pdmtp:kv_refreshed_tokens",
        "Prompt tokens the prefill computed and the decode recomputed for the drafter.",
    ),
    "decode_only_requests": (
        "pdmtp:kv_decode_only_requests",
        "Requests served without a prefill's KV.",
    ),
}
FAILED_RECVS = "vllm:mooncake_num_failed_recvs"


def prompt_tokens(prompt: object) -> int:
    """A stand-in token count: one per whitespace-separated word of the prompt's text."""
    if isinstance(prompt, list):
        return sum(prompt_tokens(p) for p in prompt)
    if isinstance(prompt, dict):
        return prompt_tokens(prompt.get("content", ""))
    return max(1, len(str(prompt).split()))


@dataclass
class HandoffCounts:
    """One decode's counts since it started; `restart` of the engine starts a new one."""

    speculative_tokens: int | None
    """The engine's k; None without speculative decoding (no backoff)."""
    derived_backoff: int | None = None
    """The backoff the engine derived from its lookahead, where it was told
    (`PDMTP_EXPECTED_PREFILL_BACKOFF`: a real engine's launcher refuses to start unless vLLM
    derives what the operator expects); None: k - 1, multi-module MTP's."""
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    failed_recvs: int = 0
    _credit: dict[str, float] = field(default_factory=lambda: {"fail": 0.0, "decode_only": 0.0})

    def backoff(self, tuning: Tuning) -> int:
        """The derived backoff (else multi-module MTP's, k - 1); none without the fixed
        connector or without speculative decoding."""
        if not tuning.fixed_connector or not self.speculative_tokens:
            return 0
        if self.derived_backoff is not None:
            return self.derived_backoff
        return max(0, self.speculative_tokens - 1)

    def fault(self, tuning: Tuning) -> Fault | None:
        """Whether this remote-prefill request is served decode-only or its pull fails."""
        for fault, rate in (
            ("decode_only", tuning.decode_only_rate),
            ("fail", tuning.pull_failure_rate),
        ):
            self._credit[fault] += rate
            if self._credit[fault] >= 1.0:
                self._credit[fault] -= 1.0
                return fault  # type: ignore[return-value]
        return None

    def refresh(self, tuning: Tuning) -> int:
        """What the fixed connector's decode recomputes beyond the backoff
        (`pdmtp_engine.connector.drafter_refresh`), with the lookahead a backoff implies
        (lookahead - 1 with multi-module MTP, 0 with one token of lookahead)."""
        if not tuning.fixed_connector or not self.speculative_tokens:
            return 0
        backoff = self.backoff(tuning)
        return max(backoff + 1, 2 - backoff)

    def pulled(self, tuning: Tuning, prompt: int) -> None:
        backoff = self.backoff(tuning)
        if prompt <= backoff:  # a prompt no longer than the backoff is pulled whole
            backoff = 0
        computed = prompt - backoff
        refresh = self.refresh(tuning)
        if computed <= refresh:  # a prefill that computed no more than it is pulled whole
            refresh = 0
        self.counts["pulled_requests"] += 1
        self.counts["pulled_tokens"] += computed - refresh
        self.counts["backoff_tokens"] += backoff
        self.counts["refreshed_tokens"] += refresh

    def decode_only(self) -> None:
        self.counts["decode_only_requests"] += 1

    def failed(self) -> None:
        self.failed_recvs += 1

    def metric_lines(self, tuning: Tuning, labels: dict[str, str]) -> list[str]:
        lines = [
            "# HELP vllm:mooncake_num_failed_recvs_total Number of failed Mooncake KV Cache "
            "receives.",
            "# TYPE vllm:mooncake_num_failed_recvs_total counter",
            f"{FAILED_RECVS}_total{label_set(labels)} {self.failed_recvs}",
        ]
        if not tuning.fixed_connector:
            return lines
        for key, (name, doc) in COUNTERS.items():
            lines += [
                f"# HELP {name}_total {doc}",
                f"# TYPE {name}_total counter",
                f"{name}_total{label_set(labels)} {self.counts[key]}",
            ]
        return lines

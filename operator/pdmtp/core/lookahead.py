"""The MTP prefill lookahead and backoff, exactly as vLLM 0.33.0 derives them.

vLLM: `VllmConfig.num_prefill_lookahead_tokens` (vllm/config/vllm.py) and the method
normalisation in `SpeculativeConfig` (vllm/config/speculative.py; the method sets are in
`pdmtp.api.methods`).
The engine tier checks this module against vLLM's own code over a matrix of inputs.
"""

from pdmtp.api.methods import LOOKAHEAD_METHODS, MTP_METHOD_ALIASES


def normalise_method(method: str | None) -> str | None:
    """The method vLLM ends up with: MTP aliases collapse to "mtp"."""
    if method is None:
        return None
    return "mtp" if method in MTP_METHOD_ALIASES else method


def prefill_lookahead(method: str | None, num_speculative_tokens: int, mtp_modules: int) -> int:
    """Tokens the drafter reads past the prefill boundary (vLLM's num_prefill_lookahead_tokens).

    `mtp_modules` is the checkpoint's num_nextn_predict_layers (vLLM's default is 1).
    """
    normalised = normalise_method(method)
    if normalised is None or normalised not in LOOKAHEAD_METHODS:
        return 0
    if normalised == "mtp" and min(mtp_modules, num_speculative_tokens) > 1:
        return num_speculative_tokens
    return 1


def prefill_backoff(lookahead: int, state_backoff: int = 0) -> int:
    """Tokens the prefill stops short of the prompt; the decode recomputes them.

    `state_backoff` is 1 for hybrid Mamba and bounded-replay sliding-window models, else 0.
    """
    return max(state_backoff, lookahead - 1)

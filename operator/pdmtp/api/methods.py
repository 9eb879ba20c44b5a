"""Speculative decoding methods, as vLLM 0.33.0 names and groups them.

vLLM: `SpeculativeConfig` (vllm/config/speculative.py, `MTPModelTypes`) and
`VllmConfig.num_prefill_lookahead_tokens` (vllm/config/vllm.py). The engine tier checks these sets
against vLLM's own code.
"""

from typing import Final

LOOKAHEAD_METHODS: Final = frozenset({"eagle", "eagle3", "mtp", "dflash", "dspark"})
"""Methods whose drafter reads past the prefill boundary."""

MTP_METHOD_ALIASES: Final = frozenset(
    {
        "mtp",
        "bailing_hybrid_mtp",
        "bailing_hybrid_v3_mtp",
        "deepseek_mtp",
        "dots3_note_mtp",
        "ernie_mtp",
        "exaone4_5_mtp",
        "exaone_moe_mtp",
        "gemma4_mtp",
        "glm4_moe_lite_mtp",
        "glm4_moe_mtp",
        "glm5_next_mtp",
        "glm_ocr_mtp",
        "hy_v3_mtp",
        "hy_v4_mtp",
        "inkling_mtp",
        "kimi_k3_mtp",
        "longcat_flash_mtp",
        "mimo_mtp",
        "mimo_v2_mtp",
        "minimax_m3_mtp",
        "nemotron_h_mtp",
        "pangu_ultra_moe_mtp",
        "qwen3_5_mtp",
        "qwen3_next_mtp",
        "qwen4_exp_mtp",
        "step3p5_mtp",
        "step5_mtp",
    }
)
"""Method names vLLM rewrites to "mtp" before computing the lookahead."""

DRAFT_MODEL_METHODS: Final = frozenset({"eagle", "eagle3", "draft_model"})
"""Methods that draft with a separate model and so need spec.speculative.draftModel."""

SPECULATIVE_METHODS: Final[tuple[str, ...]] = tuple(
    sorted(
        LOOKAHEAD_METHODS
        | MTP_METHOD_ALIASES
        # The other methods vLLM 0.33.0 accepts (custom_class needs code in the image: left out).
        | {"ngram", "ngram_gpu", "draft_model", "suffix", "extract_hidden_states"}
    )
)
"""spec.speculative.method values."""

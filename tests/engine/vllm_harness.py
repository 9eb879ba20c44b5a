"""Builders for the engine tier: tiny local checkpoints and real vLLM configs and schedulers.

Written for this project in the manner of vLLM's `tests/v1/kv_connector/unit/utils.py`: a full
`Scheduler` on `DeviceConfig("cpu")`, a KV cache config built by hand (no model is loaded), and
a checkpoint that is only a `config.json`, so nothing ever reaches the Hugging Face hub.
"""

from __future__ import annotations

import json
from itertools import count
from pathlib import Path
from typing import Any, Literal

import torch
from vllm import SamplingParams
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.utils.hashing import sha256
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
)
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

BLOCK_SIZE = 16
EOS_TOKEN_ID = 1023
KvRole = Literal["kv_producer", "kv_consumer"]

STOCK_CONNECTOR = ("MooncakeConnector", None)
"""vLLM's own connector, from its registry."""
FIXED_CONNECTOR = ("BackoffMooncakeConnector", "pdmtp_engine.connector")
"""This project's connector, loaded out of tree as the rendered pods load it."""


def write_tiny_mtp_checkpoint(directory: Path, mtp_modules: int) -> Path:
    """A DeepSeek-V3-shaped checkpoint config with `mtp_modules` MTP layers, and no weights.

    DeepSeek-V3 is the reference multi-module MTP model: vLLM turns it into a `deepseek_mtp`
    draft whose `num_nextn_predict_layers` decides the lookahead.
    """
    directory.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": EOS_TOKEN_ID + 1,
        "eos_token_id": EOS_TOKEN_ID,
        "hidden_size": 64,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "kv_lora_rank": 16,
        "q_lora_rank": None,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 16,
        "v_head_dim": 16,
        "max_position_embeddings": 4096,
        "num_nextn_predict_layers": mtp_modules,
        "torch_dtype": "bfloat16",
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


def make_model_config(checkpoint: Path) -> ModelConfig:
    return ModelConfig(
        model=str(checkpoint), skip_tokenizer_init=True, dtype="float16", seed=0, max_model_len=4096
    )


def make_speculative_config(
    model_config: ModelConfig,
    parallel_config: ParallelConfig,
    method: str | None,
    num_speculative_tokens: int,
) -> SpeculativeConfig | None:
    if method is None:
        return None
    return SpeculativeConfig(
        method=method,
        num_speculative_tokens=num_speculative_tokens,
        target_model_config=model_config,
        target_parallel_config=parallel_config,
    )


def make_vllm_config(
    checkpoint: Path,
    *,
    method: str | None,
    num_speculative_tokens: int = 0,
    kv_role: KvRole | None = None,
    connector: tuple[str, str | None] = FIXED_CONNECTOR,
    max_num_batched_tokens: int = 256,
) -> VllmConfig:
    """A real VllmConfig on CPU, with the Mooncake connector in `kv_role` when one is given."""
    model_config = make_model_config(checkpoint)
    parallel_config = ParallelConfig()
    kv_transfer_config = None
    if kv_role is not None:
        connector_name, module_path = connector
        kv_transfer_config = KVTransferConfig(
            kv_connector=connector_name,
            kv_connector_module_path=module_path,
            kv_role=kv_role,
            kv_connector_extra_config={"mooncake_protocol": "tcp"},
        )
    cache_config = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True)
    return VllmConfig(
        model_config=model_config,
        parallel_config=parallel_config,
        speculative_config=make_speculative_config(
            model_config, parallel_config, method, num_speculative_tokens
        ),
        scheduler_config=SchedulerConfig(
            max_num_seqs=16,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=model_config.max_model_len,
            is_encoder_decoder=False,
        ),
        cache_config=cache_config,
        kv_transfer_config=kv_transfer_config,
        device_config=DeviceConfig("cpu"),
    )


def _attention_group() -> KVCacheGroupSpec:
    return KVCacheGroupSpec(
        ["model.layers.0.self_attn"],
        FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=16, dtype=torch.float16),
    )


def full_attention_kv_cache_config(num_blocks: int = 1000) -> KVCacheConfig:
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[_attention_group()],
    )


def hybrid_mamba_kv_cache_config(num_blocks: int = 64) -> KVCacheConfig:
    """Attention plus a GDN state group: what vLLM builds for a hybrid Mamba-style model."""
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            _attention_group(),
            KVCacheGroupSpec(
                ["model.layers.1.linear_attn"],
                MambaSpec(
                    block_size=BLOCK_SIZE,
                    shapes=((6, 3), (1, 2, 2)),
                    dtypes=(torch.float16, torch.float16),
                    mamba_type=MambaAttentionBackendEnum.GDN_ATTN,
                ),
            ),
        ],
    )


def make_scheduler(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> Scheduler:
    """vLLM's real scheduler; it builds the configured connector in its SCHEDULER role."""
    vllm_config.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK_SIZE,
        log_stats=True,
    )


_request_ids = count(1)
_none_hash_ready = False


def make_request(
    num_prompt_tokens: int,
    *,
    kv_transfer_params: dict[str, Any] | None,
    max_tokens: int = 16,
    prompt_logprobs: int | None = None,
) -> Request:
    """A tokenised request whose prompt tokens are distinct per request (no accidental hits)."""
    global _none_hash_ready
    if not _none_hash_ready:
        init_none_hash(sha256)
        _none_hash_ready = True
    request_number = next(_request_ids)
    sampling_params = SamplingParams(max_tokens=max_tokens, prompt_logprobs=prompt_logprobs)
    sampling_params.update_from_generation_config({}, EOS_TOKEN_ID)
    request = Request(
        request_id=f"req-{request_number}",
        prompt_token_ids=[
            (request_number * 97 + i) % EOS_TOKEN_ID for i in range(num_prompt_tokens)
        ],
        sampling_params=sampling_params,
        pooling_params=None,
        block_hasher=get_request_block_hasher(BLOCK_SIZE, sha256),
    )
    request.kv_transfer_params = kv_transfer_params
    return request


def remote_decode_params(transfer_id: str = "xfer-1") -> dict[str, Any]:
    """What the router sends the prefill engine."""
    return {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": transfer_id}


def remote_prefill_params(transfer_id: str = "xfer-1") -> dict[str, Any]:
    """What the router sends the decode engine (the prefiller's address is never dialled here)."""
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "transfer_id": transfer_id,
        "remote_engine_id": "prefill-engine",
        "remote_bootstrap_addr": "http://127.0.0.1:1",
    }

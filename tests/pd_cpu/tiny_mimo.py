"""A tiny MiMo-style MTP checkpoint with random weights from a seed, and a tokenizer trained here.

vLLM serves it as the real thing: `MiMoForCausalLM` is its Qwen2-based MiMo model, and with
`--speculative-config '{"method": "mtp", ...}'` it builds the `MiMoMTPModel` drafter from the same
checkpoint's `model.mtp_layers.*`, whose `num_nextn_predict_layers` decides the prefill lookahead.
MiMo uses standard attention (DeepSeek-style MLA gives wrong P/D output on vLLM's CPU path, a CPU
kernel matter unrelated to the connector), and the checkpoint is small enough to load in seconds.

Random weights make the drafter's guesses nearly always wrong; this checkpoint proves token and
block accounting and output equality through the real connector, not acceptance rates.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOS_TOKEN = "<|endoftext|>"


@dataclass(frozen=True)
class TinyMimo:
    """The shape of the checkpoint. Head size 32 is one the CPU attention backend supports."""

    mtp_modules: int = 3
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 3
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vocab_size: int = 512
    max_position_embeddings: int = 4096
    # Larger than the usual 0.02 so that greedy argmax margins are wide: two engines computing the
    # same logits in different batch shapes must not flip a near-tie.
    init_std: float = 0.25
    seed: int = 20261130

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def hf_config(self, eos_token_id: int) -> dict[str, Any]:
        # model_type qwen2: transformers knows it (MiMo's own config needs remote code), and
        # vLLM picks the model class and the MTP drafter from `architectures`.
        return {
            "architectures": ["MiMoForCausalLM"],
            "model_type": "qwen2",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "tie_word_embeddings": False,
            "use_sliding_window": False,
            "attention_dropout": 0.0,
            "num_nextn_predict_layers": self.mtp_modules,
            "bos_token_id": eos_token_id,
            "eos_token_id": eos_token_id,
            # float32 keeps the P/D and single-engine computations as close as they can be.
            "torch_dtype": "float32",
        }


def _decoder_layer(prefix: str, shape: TinyMimo, normal: Any) -> dict[str, torch.Tensor]:
    """One Qwen2 decoder layer's weights, named as a Hugging Face Qwen2 checkpoint names them."""
    h, i, d = shape.hidden_size, shape.intermediate_size, shape.head_dim
    q, kv = shape.num_attention_heads * d, shape.num_key_value_heads * d
    return {
        f"{prefix}.input_layernorm.weight": torch.ones(h),
        f"{prefix}.post_attention_layernorm.weight": torch.ones(h),
        f"{prefix}.self_attn.q_proj.weight": normal(q, h),
        f"{prefix}.self_attn.q_proj.bias": normal(q),
        f"{prefix}.self_attn.k_proj.weight": normal(kv, h),
        f"{prefix}.self_attn.k_proj.bias": normal(kv),
        f"{prefix}.self_attn.v_proj.weight": normal(kv, h),
        f"{prefix}.self_attn.v_proj.bias": normal(kv),
        f"{prefix}.self_attn.o_proj.weight": normal(h, q),
        f"{prefix}.mlp.gate_proj.weight": normal(i, h),
        f"{prefix}.mlp.up_proj.weight": normal(i, h),
        f"{prefix}.mlp.down_proj.weight": normal(h, i),
    }


def checkpoint_tensors(shape: TinyMimo) -> dict[str, torch.Tensor]:
    """Every weight of the target model and its MTP modules, from `shape.seed` alone."""
    generator = torch.Generator().manual_seed(shape.seed)

    def normal(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=generator) * shape.init_std

    h, v = shape.hidden_size, shape.vocab_size
    # Embeddings at unit scale: the first layer's RMSNorm rescales them anyway.
    tensors: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": torch.randn(v, h, generator=generator),
        "model.norm.weight": torch.ones(h),
        "lm_head.weight": normal(v, h),
    }
    for layer in range(shape.num_hidden_layers):
        tensors |= _decoder_layer(f"model.layers.{layer}", shape, normal)
    # MiMo stores MTP modules 0-indexed under model.mtp_layers, each a decoder layer plus the
    # norms and projection that merge the previous hidden state with the next token's embedding.
    for module in range(shape.mtp_modules):
        prefix = f"model.mtp_layers.{module}"
        tensors |= _decoder_layer(prefix, shape, normal)
        tensors |= {
            f"{prefix}.token_layernorm.weight": torch.ones(h),
            f"{prefix}.hidden_layernorm.weight": torch.ones(h),
            f"{prefix}.input_proj.weight": normal(h, 2 * h),
            f"{prefix}.final_layernorm.weight": torch.ones(h),
        }
    return {name: t.contiguous() for name, t in tensors.items()}


def _training_corpus(seed: int, lines: int = 2000) -> list[str]:
    """Pseudo-words from a fixed syllable set: enough structure for BPE merges to form."""
    rng = random.Random(seed)
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    words = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(600)]
    return [" ".join(rng.choices(words, k=rng.randint(4, 16))) for _ in range(lines)]


def train_tokenizer(shape: TinyMimo) -> Tokenizer:
    """A byte-level BPE tokenizer with exactly `shape.vocab_size` entries, trained here."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=shape.vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_corpus(shape.seed), trainer=trainer)
    if tokenizer.get_vocab_size() != shape.vocab_size:
        raise RuntimeError(
            f"trained {tokenizer.get_vocab_size()} tokens, expected {shape.vocab_size}: "
            "enlarge the corpus"
        )
    return tokenizer


def write_checkpoint(
    directory: Path, shape: TinyMimo, tensors: dict[str, torch.Tensor] | None = None
) -> Path:
    """config.json, model.safetensors and the tokenizer files, in `directory`: the weights are
    `tensors` (every name `checkpoint_tensors` gives), or random ones from `shape.seed`."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(shape)
    eos_token_id = tokenizer.token_to_id(EOS_TOKEN)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": EOS_TOKEN,
                "bos_token": None,
                "model_max_length": shape.max_position_embeddings,
                "clean_up_tokenization_spaces": False,
            },
            indent=2,
        )
    )
    (directory / "config.json").write_text(json.dumps(shape.hf_config(eos_token_id), indent=2))
    (directory / "generation_config.json").write_text(
        json.dumps({"eos_token_id": eos_token_id, "do_sample": False}, indent=2)
    )
    weights = checkpoint_tensors(shape) if tensors is None else tensors
    save_file(weights, str(directory / "model.safetensors"))
    return directory

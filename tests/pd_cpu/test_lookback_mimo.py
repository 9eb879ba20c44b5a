"""The accuracy checkpoint's construction, from its tensors alone (no engine; a few seconds on a
quiet machine, ~1 min at a load of 20).

lookback_mimo.py claims: the target's next token is a function of the current token and the one
`distance` back, every MTP module drafts it exactly one position ahead, and layer 0's attention
puts every other position at least ATTENTION_GAP below the chosen one. What one engine then
accepts is the tier's accuracy test (test_pd_pair.py).
"""

from __future__ import annotations

import math
import random

import lookback_mimo
import pytest
import torch
from lookback_mimo import ATTENTION_GAP, LookbackMimo

# Small tensors: more threads only contend with the engines the tier runs beside.
torch.set_num_threads(1)


@pytest.mark.parametrize("distance", [0, 2, 40])
def test_the_drafter_predicts_the_target_exactly_one_position_ahead(distance: int) -> None:
    spec = LookbackMimo((distance,))
    tensors = lookback_mimo.checkpoint_tensors(spec)
    rng = random.Random(distance)
    prompt = [rng.randrange(spec.shape.vocab_size - 1) for _ in range(spec.min_prompt_tokens + 8)]
    sequence = prompt + list(lookback_mimo.continuation(tensors, spec.shape, prompt, 24))
    target = lookback_mimo.next_tokens(tensors, spec.shape, sequence)
    assert target[len(prompt) - 1 : -1] == sequence[len(prompt) :]
    # Every MTP module (vLLM's V1 runner drafts every step with module 0; V2 with each in turn).
    for module in range(spec.shape.mtp_modules):
        drafts = lookback_mimo.draft_tokens(tensors, spec.shape, sequence, module)
        wrong = [p for p in range(distance + 1, len(sequence) - 1) if drafts[p] != target[p + 1]]
        assert wrong == [], f"module {module} drafts wrong at {wrong}"


@pytest.mark.parametrize("distance", [1, 2, 40])
def test_the_next_token_depends_on_the_token_distance_back(distance: int) -> None:
    """So a drafter KV entry holding the wrong token at that distance costs the draft."""
    spec = LookbackMimo((distance,))
    tensors = lookback_mimo.checkpoint_tensors(spec)
    rng = random.Random(distance)
    sequence = [rng.randrange(spec.shape.vocab_size - 1) for _ in range(distance + 8)]
    before = lookback_mimo.next_tokens(tensors, spec.shape, sequence)[-1]
    changed = 0
    vocab = spec.shape.vocab_size - 1
    for replacement in range(8):
        edited = list(sequence)
        edited[-1 - distance] = (edited[-1 - distance] + 1 + replacement) % vocab
        changed += lookback_mimo.next_tokens(tensors, spec.shape, edited)[-1] != before
        # Any other position leaves it alone.
        other = list(sequence)
        other[-2 - distance] = edited[-1 - distance]
        assert lookback_mimo.next_tokens(tensors, spec.shape, other)[-1] == before
    assert changed >= 7, changed


@pytest.mark.parametrize("distance", [0, 3, 40])
def test_attention_scores_peak_at_the_distance_with_the_gap(distance: int) -> None:
    """Layer 0's q and k after vLLM's rotary embedding (neox style, as lookback_mimo's _rope),
    scaled by head_dim**-0.5: at every query position up to the context, the key `distance`
    back scores ATTENTION_GAP above every other key."""
    spec = LookbackMimo((distance,))
    tensors = lookback_mimo.checkpoint_tensors(spec)
    d = spec.shape.head_dim
    q_bias = tensors["model.layers.0.self_attn.q_proj.bias"][:d]
    k_bias = tensors["model.layers.0.self_attn.k_proj.bias"][:d]
    query_position = spec.shape.max_position_embeddings - 1
    keys = torch.arange(query_position + 1)
    q = lookback_mimo._rope(q_bias.view(1, 1, d), torch.tensor([query_position]), d)[0, 0]
    k = lookback_mimo._rope(k_bias.view(1, 1, d).expand(len(keys), 1, d), keys, d)[:, 0]
    scores = (k.double() @ q.double()) / math.sqrt(d)
    peak = query_position - distance
    assert int(scores.argmax()) == peak
    others = torch.cat([scores[:peak], scores[peak + 1 :]])
    assert float(scores[peak] - others.max()) >= ATTENTION_GAP - 1e-3

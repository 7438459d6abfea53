"""The static decoder's prefill: a fill's distinct prompts through the model once, eagerly, each prompt's keys and
values written into the first P columns of its samples' cache rows (`rlfarm.engines.static_decoder`)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from rlfarm.engines.decode_state import DecodeState
from rlfarm.engines.llama_attention import repeat_kv
from rlfarm.models.lm import position_ids_from_mask


def run_prompts(decoder, state: DecodeState, prompt: torch.Tensor, prompt_mask: torch.Tensor, slots: list[int],
                prompts: list[int]) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """Run the distinct `prompts` (indices into `prompt`, one per slot; a group's samples are consecutive repeats)
    once, and write each one's keys/values into columns [0, P) of its slots' rows, the rest of each row zeroed
    (stale columns are masked, but 0 × NaN would not be). Returns (the distinct prompts, their last position's
    hidden state before the final norm [distinct, hidden], how many of `slots` each one fills)."""
    prompt_len, device = prompt.shape[1], decoder.device
    distinct, counts = torch.unique_consecutive(torch.tensor(prompts, device=device), return_counts=True)
    ids, mask = prompt[distinct], prompt_mask[distinct]
    valid = mask.bool()
    positions = position_ids_from_mask(mask)
    cos, sin = state.cos[positions], state.sin[positions]  # [prompts, P, D]
    causal = torch.ones(prompt_len, prompt_len, dtype=torch.bool, device=device).tril()
    # a query sees earlier real tokens and itself (so a pad query's softmax is never empty)
    allowed = (causal & valid[:, None, None, :]) | torch.eye(prompt_len, dtype=torch.bool, device=device)
    rows = torch.tensor(slots, device=device)
    hidden = decoder.base.model.embed_tokens(ids)
    for i, layer in enumerate(decoder.layers):
        query, key, value = decoder.projections.attention(i, layer.input_layernorm(hidden), cos, sin)
        for cache, written in ((state.keys[i], key), (state.values[i], value)):
            cache[rows, :, :prompt_len] = written.repeat_interleave(counts, dim=0, output_size=len(slots))
            cache[rows, :, prompt_len:] = 0
        out = F.scaled_dot_product_attention(query, repeat_kv(key, decoder.groups), repeat_kv(value, decoder.groups),
                                             attn_mask=allowed, scale=decoder.scaling)
        hidden = hidden + layer.self_attn.o_proj(out.transpose(1, 2).reshape(len(distinct), prompt_len, -1))
        hidden = hidden + decoder.projections.mlp(i, layer.post_attention_layernorm(hidden))
    return distinct.tolist(), hidden[:, -1].clone(), counts  # a copy: a view would keep all of `hidden` alive

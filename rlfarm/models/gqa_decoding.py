"""Decoding attention for grouped-query models without copying the KV cache: one query token per step, the G query
heads that share a key/value head read as G queries of that head (`packed_gqa_attention`).

HF's SDPA path (transformers < 5.2x) expands the cache with `repeat_kv` before every attention call when a mask is
given: at a decode step with a long cache that copy is the step. On an H200, a Qwen2.5-0.5B-shaped model (14 query /
2 KV heads) decoding 256 rows after a 212-token prompt spent 52 % of each step's GPU time in those copies (two per
layer, 110 µs each) against 19 % in attention itself (docs/benchmarks.md, VLA rollout). Packing the query heads instead
reads the cache once; the arithmetic is the same attention (newer transformers do the same packing themselves).
Prompt passes (more than one query token) and models without grouping keep HF's SDPA."""
from __future__ import annotations

import torch
import torch.nn.functional as F

NAME = "rlfarm_packed_gqa"


def packed_gqa_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                         **kwargs) -> tuple[torch.Tensor, None]:
    """query [B, Hq, 1, D], key/value [B, Hkv, L, D], attention_mask [B, 1, 1, L] (True: attend) or None →
    ([B, 1, Hq, D], None), as transformers' attention functions return."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if groups == 1 or query.shape[2] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    batch, heads, _, dim = query.shape
    packed = query.reshape(batch, heads // groups, groups, dim)  # query heads h·G … h·G + G − 1 share KV head h
    mask = attention_mask[:, :, :, : key.shape[-2]] if attention_mask is not None else None
    out = F.scaled_dot_product_attention(packed, key, value, attn_mask=mask, scale=scaling, is_causal=False)
    return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None


def use_packed_gqa_decoding(model) -> str:
    """Switch an HF model's text attention (the `text_config` of a Llava-style model, else the model's own) to
    `packed_gqa_attention`. Returns what was done, for logs and stats; a model or transformers version that refuses
    keeps its attention ("unchanged: ...")."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, packed_gqa_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)  # the masks SDPA takes: boolean, True = attend
    target = {"text_config": NAME} if hasattr(model.config, "text_config") else NAME
    try:
        model.set_attn_implementation(target)
    except (AttributeError, TypeError, ValueError) as error:
        return f"unchanged: {type(error).__name__}: {str(error)[:120]}"
    return "packed GQA decoding"

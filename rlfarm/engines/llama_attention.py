"""The attention pieces of the static decoder (`rlfarm.engines.static_decoder`) for Llama-family layers: rotary
embedding as the family applies it, the query/key/value projections of a layer (its own modules, LoRA adapters
included, or one fused GEMM over their weights), and one query token per row attending to a whole slot-major cache
row, grouped-query without copying the cache. Pure functions of tensors and the layer's modules, so torch.compile
traces them into the decode step."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE as the Llama family applies it. x [B, heads, L, D]; cos, sin [B, L, D]."""
    return x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1)


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, kv_heads, L, D] → [B, kv_heads × groups, L, D], each kv head serving `groups` query heads."""
    if groups == 1:
        return x
    batch, heads, length, dim = x.shape
    return x[:, :, None].expand(batch, heads, groups, length, dim).reshape(batch, heads * groups, length, dim)


def project(attention: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int,
            fused: Callable[[torch.Tensor], tuple[torch.Tensor, ...]] | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [B, L, H] → rotated query [B, heads, L, D], rotated key and value [B, kv_heads, L, D]. fused: the three
    projections as one GEMM over the modules' weights (`rlfarm.engines.fused_projections`), else each module's own."""
    batch, length, _ = x.shape
    query, key, value = fused(x) if fused is not None else (attention.q_proj(x), attention.k_proj(x),
                                                             attention.v_proj(x))
    # a fused GEMM's parts are column slices: each splits its last dim into heads as a view all the same
    query = query.view(batch, length, -1, head_dim)
    key = key.view(batch, length, -1, head_dim)
    value = value.view(batch, length, -1, head_dim)
    if hasattr(attention, "q_norm"):  # qwen3 normalizes each head's query and key
        query, key = attention.q_norm(query), attention.k_norm(key)
    query, key, value = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    return apply_rotary(query, cos, sin), apply_rotary(key, cos, sin), value


def attend_cache(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor,
                 groups: int, scaling: float) -> torch.Tensor:
    """One query token per row against the whole cache, grouped-query without copying the cache.
    query [B, heads, 1, D], keys/values [B, kv_heads, S, D], visible [B, 1, 1, S] → [B, 1, heads × D]."""
    batch, kv_heads, _, head_dim = keys.shape
    grouped = query.reshape(batch, kv_heads, groups, head_dim)
    scores = torch.matmul(grouped, keys.transpose(2, 3)).float() * scaling  # [B, kv_heads, G, S]
    weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1).to(values.dtype)
    return torch.matmul(weights, values).reshape(batch, 1, -1)

"""The floor under a decode step (`rlfarm bench engine`'s decode-step rows, issue 35): what one step must read
from HBM and what it must compute, each over the card's datasheet peak.

- HBM bound: the weights a step reads (all parameters but an untied input embedding, of which a step gathers one
  row per slot) plus the KV cache of every row at the mean context, over the bandwidth (`HBM_TB_S`).
- compute bound: the step's matrix FLOPs over the dense bf16 tensor-core peak (`DENSE_TFLOPS`): 2 × the matrix
  parameters (the same weights, 2-D ones: norms and biases are elementwise) × the rows, plus the attention's
  2 × 2 × heads × head_dim × context per row and layer. At batch 256 a 7B step's GEMMs are ~3.6 TFLOP: the
  GEMMs are compute-bound there, not bandwidth-bound.
- roofline = max(HBM, compute): no step can beat either. The serial bound is tighter and still a floor: the
  step's weight GEMMs and its attention run one after the other, each bound by its own limit —
  max(weight bytes / bandwidth, GEMM FLOPs / peak) + max(KV bytes / bandwidth, attention FLOPs / peak).
"""
from __future__ import annotations

import torch


def step_cost(model: torch.nn.Module, batch: int, context: float) -> dict[str, float]:
    """What one decode step at `batch` rows of mean `context` tokens reads (weight_bytes, kv_bytes) and computes
    (gemm_flops, attention_flops)."""
    embedding = model.get_input_embeddings().weight
    untied = embedding is not model.get_output_embeddings().weight
    weights = [p for p in model.parameters() if not (untied and p is embedding)]
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    layers, size = config.num_hidden_layers, embedding.element_size()
    return {"weight_bytes": float(sum(p.numel() * p.element_size() for p in weights)),
            "kv_bytes": float(batch * context * layers * 2 * config.num_key_value_heads * head_dim * size),
            "gemm_flops": 2.0 * batch * sum(p.numel() for p in weights if p.dim() >= 2),
            "attention_flops": 4.0 * batch * context * layers * config.num_attention_heads * head_dim}


def bounds(cost: dict[str, float], tb_s: float | None, tflops: float | None) -> dict[str, float]:
    """The step's floors in ms from its cost and the card's figures (those it lacks a figure for left out)."""
    out = {}
    if tb_s:
        out["hbm_bound_ms"] = 1e3 * (cost["weight_bytes"] + cost["kv_bytes"]) / (tb_s * 1e12)
    if tflops:
        out["compute_bound_ms"] = 1e3 * (cost["gemm_flops"] + cost["attention_flops"]) / (tflops * 1e12)
    if tb_s and tflops:
        out["roofline_ms"] = max(out["hbm_bound_ms"], out["compute_bound_ms"])
        out["serial_bound_ms"] = 1e3 * (max(cost["weight_bytes"] / (tb_s * 1e12), cost["gemm_flops"] / (tflops * 1e12))
                                        + max(cost["kv_bytes"] / (tb_s * 1e12),
                                              cost["attention_flops"] / (tflops * 1e12)))
    return out

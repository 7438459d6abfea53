"""Flash-decoding over the slot-major KV cache with per-row lengths: one query token per row attends to the
columns its own row has written, read once, the softmax folded in (Triton; CUDA).

Why: the matmul path (`llama_attention.attend_cache`) reads every row up to one context bucket, which the
furthest running row decides; under continuous refill some row is nearly always near the cap, so every row pays
for the longest one's columns. Here a program serves one (row, kv head, split of `SPLIT` columns) and stops at
its row's newest column: a row refilled 100 steps ago reads its prompt and 100 columns, not the cap's. Scores stay
in registers (fp32), with an online softmax per split (Dao et al., "Flash-Decoding", 2023); a second kernel
merges the splits. Grouped-query: a program loads its kv head's K/V block once for all the query heads it serves
(padded to 16 rows, the smallest tensor-core tile).

Visibility is the cache's own `key_valid` mask (left padding of prompts, stale columns of an ended sample),
loaded per block beside K: the same columns the matmul path masks. Registered as the custom op
`rlfarm::decode_attention` so torch.compile treats it as one opaque call and CUDA graphs capture its two
launches. Triton ships with CUDA builds of torch, not CPU ones: `available()` says whether it can run (its CPU test
runs under `TRITON_INTERPRET=1` where Triton is installed)."""
from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU builds of torch come without Triton: the matmul path serves there
    triton = None

SPLIT = 256    # columns per program: a few splits keep small batches' tails busy on 132 SMs
BLOCK = 64     # columns per K/V load
MIN_ROWS = 16  # tl.dot's smallest M: the query heads of one kv head are padded to it


def available(device: torch.device) -> bool:
    """Whether the kernel can run for tensors on `device`."""
    if triton is None:
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


if triton is not None:
    @triton.jit
    def _attend_splits(q_ptr, k_ptr, v_ptr, valid_ptr, column_ptr, acc_ptr, max_ptr, sum_ptr,
                       q_stride_b, q_stride_h, k_stride_b, k_stride_h, k_stride_s, v_stride_b, v_stride_h,
                       v_stride_s, valid_stride_b, scaling,
                       GROUPS: tl.constexpr, ROWS: tl.constexpr, DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                       SPLIT_N: tl.constexpr, PRECISION: tl.constexpr):
        row, head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        heads, splits = tl.num_programs(1), tl.num_programs(2)
        stop = tl.minimum((split + 1) * SPLIT_N, tl.load(column_ptr + row) + 1)  # this row's newest column + 1
        group, dim, cols = tl.arange(0, ROWS), tl.arange(0, DIM), tl.arange(0, BLOCK_N)
        q = tl.load(q_ptr + row * q_stride_b + (head * GROUPS + group)[:, None] * q_stride_h + dim[None, :],
                    mask=(group < GROUPS)[:, None], other=0.0)
        best = tl.full([ROWS], float("-inf"), tl.float32)
        total = tl.zeros([ROWS], tl.float32)
        acc = tl.zeros([ROWS, DIM], tl.float32)
        k_row = k_ptr + row * k_stride_b + head * k_stride_h
        v_row = v_ptr + row * v_stride_b + head * v_stride_h
        for start in range(split * SPLIT_N, stop, BLOCK_N):
            col = start + cols
            inside = col < stop
            seen = tl.load(valid_ptr + row * valid_stride_b + col, mask=inside, other=0) != 0
            k = tl.load(k_row + col[:, None] * k_stride_s + dim[None, :], mask=inside[:, None], other=0.0)
            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scaling  # [ROWS, BLOCK_N], fp32
            scores = tl.where(seen[None, :], scores, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, 1))
            shift = tl.where(new_best == float("-inf"), 0.0, new_best)  # no column seen yet: keep zeros, not NaN
            weights = tl.exp(scores - shift[:, None])
            rescale = tl.exp(best - shift)
            total = total * rescale + tl.sum(weights, 1)
            v = tl.load(v_row + col[:, None] * v_stride_s + dim[None, :], mask=inside[:, None], other=0.0)
            acc = acc * rescale[:, None] + tl.dot(weights.to(v.dtype), v, input_precision=PRECISION)
            best = new_best
        at = (row * heads + head) * splits + split
        tl.store(acc_ptr + at * ROWS * DIM + group[:, None] * DIM + dim[None, :], acc)
        tl.store(max_ptr + at * ROWS + group, best)
        tl.store(sum_ptr + at * ROWS + group, total)

    @triton.jit
    def _merge_splits(acc_ptr, max_ptr, sum_ptr, out_ptr, out_stride_b, splits,
                      GROUPS: tl.constexpr, ROWS: tl.constexpr, DIM: tl.constexpr, SPLITS: tl.constexpr):
        row, head = tl.program_id(0), tl.program_id(1)
        heads = tl.num_programs(1)
        split, group, dim = tl.arange(0, SPLITS), tl.arange(0, ROWS), tl.arange(0, DIM)
        first = (row * heads + head) * splits
        used = split < splits
        best = tl.load(max_ptr + (first + split)[:, None] * ROWS + group[None, :], mask=used[:, None],
                       other=float("-inf"))                                      # [SPLITS, ROWS]
        total = tl.load(sum_ptr + (first + split)[:, None] * ROWS + group[None, :], mask=used[:, None], other=0.0)
        top = tl.max(best, 0)
        weight = tl.exp(best - tl.where(top == float("-inf"), 0.0, top)[None, :])  # a split that saw nothing: 0
        acc = tl.load(acc_ptr + ((first + split)[:, None, None] * ROWS + group[None, :, None]) * DIM
                      + dim[None, None, :], mask=used[:, None, None], other=0.0)  # [SPLITS, ROWS, DIM]
        out = tl.sum(acc * weight[:, :, None], 0) / tl.sum(total * weight, 0)[:, None]
        tl.store(out_ptr + row * out_stride_b + (head * GROUPS + group)[:, None] * DIM + dim[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=(group < GROUPS)[:, None])


@torch.library.custom_op("rlfarm::decode_attention", mutates_args=())
def decode_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, key_valid: torch.Tensor,
                     column: torch.Tensor, groups: int, scaling: float) -> torch.Tensor:
    """query [B, heads, 1, D] (heads = kv_heads × groups), keys/values [B, kv_heads, S, D] (views of the cache,
    unit stride in D), key_valid [B, S] bool, column [B] (each row's newest written column) → [B, 1, heads × D]."""
    batch, kv_heads, columns, dim = keys.shape
    rows = max(MIN_ROWS, triton.next_power_of_2(groups))
    splits = triton.cdiv(columns, SPLIT)
    q = query[:, :, 0]
    partial = query.new_empty((batch, kv_heads, splits, rows, dim), dtype=torch.float32)
    best = query.new_empty((batch, kv_heads, splits, rows), dtype=torch.float32)
    total = torch.empty_like(best)
    valid = key_valid.view(torch.uint8)
    _attend_splits[(batch, kv_heads, splits)](
        q, keys, values, valid, column, partial, best, total,
        q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), keys.stride(2), values.stride(0),
        values.stride(1), values.stride(2), valid.stride(0), scaling,
        GROUPS=groups, ROWS=rows, DIM=dim, BLOCK_N=BLOCK, SPLIT_N=SPLIT,
        PRECISION="ieee" if query.dtype == torch.float32 else "tf32")  # fp32 models: no TF32 rounding
    out = query.new_empty((batch, 1, kv_heads * groups * dim))
    _merge_splits[(batch, kv_heads)](partial, best, total, out, out.stride(0), splits,
                                     GROUPS=groups, ROWS=rows, DIM=dim, SPLITS=triton.next_power_of_2(splits))
    return out


@decode_attention.register_fake
def _(query, keys, values, key_valid, column, groups, scaling):
    return query.new_empty((query.shape[0], 1, query.shape[1] * query.shape[3]))

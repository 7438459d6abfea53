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
loaded per block beside K: the same columns the matmul path masks. The decoder calls it
through `attend_rows`, which torch.compile leaves out of its graph, after its compiled pieces wrote the step's keys
and values into the cache (`rlfarm.engines.decode_layers`); CUDA graphs capture its launches.
Triton ships with CUDA builds of torch, not CPU ones: `available()` says whether it can run (it also runs under
`TRITON_INTERPRET=1` where Triton is installed)."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU builds of torch come without Triton: the matmul path serves there
    triton = None

MIN_TILE = 16      # tl.dot's smallest M and K: query heads of a kv head and the head dim are padded to it


@dataclass(frozen=True)
class Launch:
    """How the kernel is launched: `block` columns per K/V load, `warps` and `stages` (Triton's software
    pipelining depth) per program, and `busy_programs`: fewer (row, kv head) pairs than this split their columns
    over more programs (~4 per SM of an H100/H200). `launch/device/decode_attention_sweep.py` times the choices
    on a card. On an H200 (2026-11-30) (128, 4, 2) took 4 % less than this one over 256 rows (2.78 vs 2.90 ms a
    7B step's launches, even batch; 2.52 vs 2.63 ragged), but it makes half the splits for a shrinking batch's
    tail, and the one refill run with it (which also had another variant of the kernel) was slower: this stays the
    default until a whole run says otherwise (docs/benchmarks.md)."""
    block: int = 64
    warps: int = 4
    stages: int = 3
    busy_programs: int = 528


LAUNCH = Launch()


def available(device: torch.device) -> bool:
    """Whether the kernel can run for tensors on `device`."""
    if triton is None:
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


if triton is not None:
    @triton.jit
    def _attend_splits(q_ptr, k_ptr, v_ptr, valid_ptr, column_ptr, acc_ptr, max_ptr, sum_ptr, out_ptr,
                       q_stride_b, q_stride_h, k_stride_b, k_stride_h, k_stride_s, v_stride_b, v_stride_h,
                       v_stride_s, valid_stride_b, out_stride_b, split_len, scaling,
                       GROUPS: tl.constexpr, DIM: tl.constexpr, ROWS: tl.constexpr, DIMS: tl.constexpr,
                       BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, DIRECT: tl.constexpr):
        row, head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        heads, splits = tl.num_programs(1), tl.num_programs(2)
        stop = tl.minimum((split + 1) * split_len, tl.load(column_ptr + row) + 1)  # this row's newest column + 1
        group, dim, cols = tl.arange(0, ROWS), tl.arange(0, DIMS), tl.arange(0, BLOCK_N)
        real = (group < GROUPS)[:, None] & (dim < DIM)[None, :]
        q = tl.load(q_ptr + row * q_stride_b + (head * GROUPS + group)[:, None] * q_stride_h + dim[None, :],
                    mask=real, other=0.0)
        best = tl.full([ROWS], float("-inf"), tl.float32)
        total = tl.zeros([ROWS], tl.float32)
        acc = tl.zeros([ROWS, DIMS], tl.float32)
        k_row = k_ptr + row * k_stride_b + head * k_stride_h
        v_row = v_ptr + row * v_stride_b + head * v_stride_h
        for start in range(split * split_len, stop, BLOCK_N):
            col = start + cols
            inside = col < stop
            seen = tl.load(valid_ptr + row * valid_stride_b + col, mask=inside, other=0) != 0
            block = inside[:, None] & (dim < DIM)[None, :]
            k = tl.load(k_row + col[:, None] * k_stride_s + dim[None, :], mask=block, other=0.0)
            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scaling  # [ROWS, BLOCK_N], fp32
            scores = tl.where(seen[None, :], scores, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, 1))
            shift = tl.where(new_best == float("-inf"), 0.0, new_best)  # no column seen yet: keep zeros, not NaN
            weights = tl.exp(scores - shift[:, None])
            rescale = tl.exp(best - shift)
            total = total * rescale + tl.sum(weights, 1)
            v = tl.load(v_row + col[:, None] * v_stride_s + dim[None, :], mask=block, other=0.0)
            acc = acc * rescale[:, None] + tl.dot(weights.to(v.dtype), v, input_precision=PRECISION)
            best = new_best
        if DIRECT:  # one split: this program's result is the row's
            tl.store(out_ptr + row * out_stride_b + (head * GROUPS + group)[:, None] * DIM + dim[None, :],
                     (acc / total[:, None]).to(out_ptr.dtype.element_ty), mask=real)
        else:
            at = (row * heads + head) * splits + split
            tl.store(acc_ptr + at * ROWS * DIMS + group[:, None] * DIMS + dim[None, :], acc)
            tl.store(max_ptr + at * ROWS + group, best)
            tl.store(sum_ptr + at * ROWS + group, total)

    @triton.jit
    def _merge_splits(acc_ptr, max_ptr, sum_ptr, out_ptr, out_stride_b, splits,
                      GROUPS: tl.constexpr, DIM: tl.constexpr, ROWS: tl.constexpr, DIMS: tl.constexpr):
        row, head = tl.program_id(0), tl.program_id(1)
        heads = tl.num_programs(1)
        group, dim = tl.arange(0, ROWS), tl.arange(0, DIMS)
        first = (row * heads + head) * splits
        best = tl.full([ROWS], float("-inf"), tl.float32)
        total = tl.zeros([ROWS], tl.float32)
        acc = tl.zeros([ROWS, DIMS], tl.float32)
        for split in range(splits):  # an online softmax over the splits' partial results
            at = first + split
            part_best = tl.load(max_ptr + at * ROWS + group)
            new_best = tl.maximum(best, part_best)
            shift = tl.where(new_best == float("-inf"), 0.0, new_best)  # a split that saw nothing weighs 0
            old, part = tl.exp(best - shift), tl.exp(part_best - shift)
            total = total * old + tl.load(sum_ptr + at * ROWS + group) * part
            acc = acc * old[:, None] + tl.load(acc_ptr + at * ROWS * DIMS + group[:, None] * DIMS
                                               + dim[None, :]) * part[:, None]
            best = new_best
        real = (group < GROUPS)[:, None] & (dim < DIM)[None, :]
        tl.store(out_ptr + row * out_stride_b + (head * GROUPS + group)[:, None] * DIM + dim[None, :],
                 (acc / total[:, None]).to(out_ptr.dtype.element_ty), mask=real)


def decode_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, key_valid: torch.Tensor,
                     column: torch.Tensor, groups: int, scaling: float, launch: Launch | None = None) -> torch.Tensor:
    """query [B, heads, 1, D] (heads = kv_heads × groups), keys/values [B, kv_heads, S, D] (views of the cache,
    unit stride in D), key_valid [B, S] bool, column [B] (each row's newest written column) → [B, 1, heads × D].
    Few rows (a shrinking batch's tail) split their columns over more programs, merged by a second kernel."""
    launch = launch or LAUNCH
    batch, kv_heads, columns, dim = keys.shape
    rows, dims = max(MIN_TILE, triton.next_power_of_2(groups)), max(MIN_TILE, triton.next_power_of_2(dim))
    splits = max(1, min(triton.cdiv(launch.busy_programs, batch * kv_heads), triton.cdiv(columns, 4 * launch.block)))
    split_len = triton.cdiv(triton.cdiv(columns, splits), launch.block) * launch.block
    splits = triton.cdiv(columns, split_len)
    q, valid = query[:, :, 0], key_valid.view(torch.uint8)
    out = query.new_empty((batch, 1, kv_heads * groups * dim))
    partial = query.new_empty((batch, kv_heads, splits, rows, dims) if splits > 1 else (1,), dtype=torch.float32)
    best = query.new_empty((batch, kv_heads, splits, rows) if splits > 1 else (1,), dtype=torch.float32)
    total = torch.empty_like(best)
    _attend_splits[(batch, kv_heads, splits)](
        q, keys, values, valid, column, partial, best, total, out,
        q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), keys.stride(2), values.stride(0),
        values.stride(1), values.stride(2), valid.stride(0), out.stride(0), split_len, scaling,
        GROUPS=groups, DIM=dim, ROWS=rows, DIMS=dims, BLOCK_N=launch.block,
        PRECISION="ieee" if query.dtype == torch.float32 else "tf32",  # fp32 models: no TF32 rounding
        DIRECT=splits == 1, num_warps=launch.warps, num_stages=launch.stages)
    if splits > 1:
        _merge_splits[(batch, kv_heads)](partial, best, total, out, out.stride(0), splits,
                                         GROUPS=groups, DIM=dim, ROWS=rows, DIMS=dims)
    return out


@torch.compiler.disable
def attend_rows(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, key_valid: torch.Tensor,
                column: torch.Tensor, groups: int, scaling: float) -> torch.Tensor:
    """`decode_attention` outside torch.compile, on purpose: inside (as an opaque custom op, when it also wrote the
    cache), inductor copied the cache into a new buffer for it per layer and step, 8.9 ms of a 20.8 ms 7B step on an
    H200. The decoder writes the step's keys and values first, in its compiled pieces (`decode_layers.open_layer`, and
    `between` for every layer after the first)."""
    return decode_attention(query, keys, values, key_valid, column, groups, scaling)

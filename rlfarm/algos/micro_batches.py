"""How an LLM update cuts a minibatch's rows into forward/backward pieces of few distinct shapes.

A GPU pays once for every input shape it has not seen: cuDNN's attention (which torch prefers on H100/H200 for the
masked attention of padded batches) builds an execution plan per (batch, length), the caching allocator grows new
segments. Dynamic sampling (`filter_groups`) keeps a different number of groups every step, so an update that fed
its kept rows as they came ran a new shape almost every step, and with fewer rows took longer than with all of them.
Here every piece has one size (`piece_rows`), and a minibatch's last piece is padded with zero-weight rows up to a
multiple of 1/ROW_BUCKETS of that size: at most ROW_BUCKETS shapes in a run, and the rows computed are the rows kept
plus less than 1/ROW_BUCKETS of a piece.
"""
from __future__ import annotations

import torch

ROW_BUCKETS = 8


def piece_rows(full_rows: int, minibatches: int, world_size: int, micro_batch_size: int | None) -> int:
    """Rows per forward/backward: `micro_batch_size`, or one rank's share of a whole minibatch of a step that kept
    every one of its `full_rows` rows."""
    minibatch = -(-full_rows // minibatches)
    return micro_batch_size or -(-minibatch // world_size)


def padded_pieces(rows: torch.Tensor, weights: torch.Tensor, size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """rows [n] (indices) and their weights [n] in pieces of `size` rows; the last piece is padded with copies of
    rows[0] weighted 0 up to the next multiple of ceil(size / ROW_BUCKETS) rows (at most `size`).
    Returns [(indices, weights)], each of one of at most ROW_BUCKETS lengths."""
    bucket = -(-size // ROW_BUCKETS)
    pieces = []
    for start in range(0, len(rows), size):
        part, part_weights = rows[start:start + size], weights[start:start + size]
        missing = min(size, -(-len(part) // bucket) * bucket) - len(part)
        if missing:
            part = torch.cat([part, rows[:1].expand(missing)])
            part_weights = torch.cat([part_weights, part_weights.new_zeros(missing)])
        pieces.append((part, part_weights))
    return pieces

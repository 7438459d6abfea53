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

import functools
from collections.abc import Callable

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


# Token-budget pieces (`algo.micro_batch_tokens`): a piece's width is rounded up to a multiple of this many columns,
# so a run meets few shapes (at most (prompt + cap) / WIDTH_STEP widths) and a row computes < WIDTH_STEP columns of
# padding on average.
WIDTH_STEP = 64


def row_spans(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, L] mask of left-padded prompts followed by right-padded responses → [B, 2]: each row's first real
    column and one past its last."""
    columns = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    real = attention_mask.bool()
    first = torch.where(real, columns, attention_mask.shape[1]).min(dim=1).values
    last = torch.where(real, columns + 1, 0).max(dim=1).values
    return torch.stack([first, last], dim=1)


def token_pieces(rows: torch.Tensor, spans: list[tuple[int, int]], rank: int, world_size: int, budget: int,
                 response_start: int, width_step: int | None = None, packed: bool = False
                 ) -> list[tuple[torch.Tensor, torch.Tensor, int, int]]:
    """This rank's pieces of one minibatch (`rows`, indices) by a token budget, without computing padding.

    The minibatch's rows are sorted longest first and dealt to the ranks in turn (rank r takes every N-th), so the
    ranks' shares are alike in tokens. A rank's rows go, in that order, into pieces of at most `budget` tokens,
    counted as rows × the piece's width: the columns from its rows' first real column to their last, rounded up to
    `width_step` (WIDTH_STEP unless given; a row longer than the budget is a piece alone). Each piece computes only
    its own columns, so long-tail lengths stop costing every row the longest row's columns. Every rank gets as many
    pieces as the rank with most (FSDP gathers weights in every forward: all ranks must run the same number); the
    missing ones are the minibatch's shortest row, weighted 0. `spans`: `row_spans` of the whole rollout, as a list.
    `packed` (`rlfarm.models.packed`: a piece computes its rows' real tokens only): the budget counts those instead.
    Returns [(indices, weights, first column, end column)]; every piece keeps the column `response_start − 1`."""
    # a piece's real columns start no later than the last prompt column, which predicts the first response token
    spans = [(min(first, response_start - 1), max(end, response_start)) for first, end in spans]
    columns = functools.partial(_columns, total=max(end for _, end in spans), step=width_step or WIDTH_STEP)
    ordered = sorted(rows.tolist(), key=lambda row: spans[row][0] - spans[row][1])  # stable: longest first
    shares = [_pack(ordered[r::world_size], spans, budget, columns, packed) for r in range(world_size)]
    padding = ([ordered[-1]], 0.0, *columns(spans[ordered[-1]]))
    pieces = shares[rank] + [padding] * (max(map(len, shares)) - len(shares[rank]))
    return [(torch.tensor(part, device=rows.device), torch.full((len(part),), weight, device=rows.device), first, end)
            for part, weight, first, end in pieces]


def _pack(rows: list[int], spans: list[tuple[int, int]], budget: int,
          columns: Callable[[tuple[int, int]], tuple[int, int]], packed: bool
          ) -> list[tuple[list[int], float, int, int]]:
    """Rows in order into pieces while rows × width (packed: the rows' own tokens) stays within the budget (the
    piece's span kept as it grows)."""
    pieces: list[tuple[list[int], float, int, int]] = []
    part: list[int] = []
    span, tokens = (0, 0), 0
    for row in rows:
        grown = (min(span[0], spans[row][0]), max(span[1], spans[row][1])) if part else spans[row]
        first, end = columns(grown)
        length = spans[row][1] - spans[row][0]
        if part and (tokens + length if packed else (len(part) + 1) * (end - first)) > budget:
            pieces.append((part, 1.0, *columns(span)))
            part, grown, tokens = [], spans[row], 0
        part.append(row)
        span, tokens = grown, tokens + length
    if part:
        pieces.append((part, 1.0, *columns(span)))
    return pieces


def _columns(span: tuple[int, int], total: int, step: int) -> tuple[int, int]:
    """The columns [first, end) a piece computes for its rows' real span: widened to a multiple of `step`, leftwards
    where the right edge is the rollout's."""
    first, last = span
    width = min(total, -(-(last - first) // step) * step)
    end = min(total, first + width)
    return end - width, end

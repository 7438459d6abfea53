"""The shapes a static decoder's step runs at (`rlfarm.engines.static_decoder`): active-batch buckets (rows) and
context buckets (cache columns). Each pair has its own CUDA graph, so both lists are short and fixed per call."""
from __future__ import annotations

CACHE_ROUNDING = 64  # a cache row's length is rounded up to this many columns
MIN_BUCKET = 16
CONTEXT_STEP = CACHE_ROUNDING  # columns between context buckets: finer means fewer wasted reads, more graphs


def buckets(slots: int) -> list[int]:
    """Active-batch sizes a refilling call runs at, largest first: the slots, then powers of two below."""
    sizes, size = [slots], MIN_BUCKET
    while size < slots:
        sizes.append(size)
        size *= 2
    return sorted(set(sizes), reverse=True)


def contexts(cache_len: int, prompt_len: int, step: int | None) -> list[int]:
    """Context buckets of a call, smallest first: multiples of `step` columns above the prompt, and the whole
    row; None: the whole row alone."""
    if not step:
        return [cache_len]
    return sorted({min(end, cache_len) for end in range(step, cache_len + step, step) if end > prompt_len})

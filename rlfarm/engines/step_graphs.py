"""The static decoder's CUDA graphs: one per (batch bucket, context bucket) of a state, all in one memory pool
(`rlfarm.engines.static_decoder`).

A capture runs nothing, but the first one needs the step warmed up: compiled, cuBLAS and the allocator settled,
Triton's autotuning done. Warm-up steps leave garbage in the state, which is why every bucket is captured before a
call fills a slot (`StaticDecoder.prepare`). A state warms up once: its other buckets run the same code with other
(dynamic) shapes, so they are captured directly, and warmed up only if that capture fails. Why it matters: a
colocated engine gives its memory back at every sleep and captures all its graphs again at wake (85 graphs at the
7B speed run's buckets: 5 batch × 17 context), and each warm-up ran two whole steps."""
from __future__ import annotations

from collections.abc import Callable

import torch

from rlfarm.engines.decode_state import DecodeState


def capture(root: DecodeState, step: Callable[[], None], device: torch.device) -> tuple[torch.cuda.CUDAGraph, bool]:
    """`step` captured into `root`'s pool, and whether it had to be warmed up first (the state's first graph, or a
    capture that failed without)."""
    if root.graphs:
        graph = _captured(root, step, strict=False)
        if graph is not None:
            return graph, False
    side = torch.cuda.Stream(device)  # warm up on a side stream, as torch.cuda.graphs asks
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    return _captured(root, step, strict=True), True


def _captured(root: DecodeState, step: Callable[[], None], strict: bool) -> torch.cuda.CUDAGraph | None:
    """None where not `strict` and the capture failed (a step that needs a warm-up first)."""
    if root.graph_pool is None:
        root.graph_pool = torch.cuda.graph_pool_handle()
    graph = torch.cuda.CUDAGraph()
    try:
        # one pool for all: a step's temporaries do not outlive its replay, and steps replay one at a time
        with torch.cuda.graph(graph, pool=root.graph_pool, capture_error_mode="thread_local"):
            step()
    except RuntimeError:
        if strict:
            raise
        return None
    return graph

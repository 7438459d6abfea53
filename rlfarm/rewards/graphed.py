"""A batch function replayed as CUDA graphs, one per size class: a reward model's call launches one graph per
sub-batch instead of the hundreds of kernels of a ViT tower.

Why: inside the pipeline a labeler shares the host with dozens of env runners, and a profile of one (py-spy, 2×
H200, ViT-L/14 compiled) spent 80–99 % of its time launching the tower's kernels while its GPU was 44–79 % busy:
the host, not the device, set the pace. A graph replay is one launch.

Rows are padded up to the next size class (powers of two from `min_rows`, and `max_rows` itself), so a handful of
graphs serve every sub-batch; the padding rows hold whatever the input buffer held before and their outputs are
dropped. The graphs share one memory pool: they are replayed one after another on one stream, and each replay's
rows are copied out before the next replay can overwrite them."""
from __future__ import annotations

from collections.abc import Callable

import torch


def size_classes(max_rows: int, min_rows: int = 8) -> list[int]:
    """max_rows, then the powers of two below it down to min_rows (at least one class: max_rows)."""
    if max_rows < 1 or min_rows < 1:
        raise ValueError(f"size classes need max_rows and min_rows >= 1, got {max_rows} and {min_rows}")
    sizes, size = [max_rows], 1 << (max(max_rows - 1, 1)).bit_length() - 1
    while size >= min_rows:
        if size < max_rows:
            sizes.append(size)
        size //= 2
    return sizes


class GraphedRows:
    """`fn(rows) -> out`, rows [n, *row_shape] of `dtype` on a CUDA `device` and out [n, ...], captured once per size
    class. Calls with other row shapes or dtypes, or more than max_rows rows, run `fn` itself."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor], row_shape: tuple[int, ...], dtype: torch.dtype,
                 device: torch.device, max_rows: int, min_rows: int = 8):
        self.fn = fn
        self._input = torch.zeros((max_rows, *row_shape), dtype=dtype, device=device)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        sizes = size_classes(max_rows, min_rows)
        with torch.cuda.device(device):  # capture on `device` whichever device is current
            self._capture(sizes)
        self._sizes = sorted(self._graphs)

    def _capture(self, sizes: list[int]) -> None:
        fn, device = self.fn, self._input.device
        warm = torch.cuda.Stream(device)  # capture needs its kernels compiled and autotuned, off the default stream
        warm.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(warm):
            for size in sizes:
                for _ in range(2):
                    fn(self._input[:size])
        torch.cuda.current_stream(device).wait_stream(warm)
        pool = torch.cuda.graph_pool_handle()
        for size in sizes:  # largest first: the smaller graphs fit into the memory the largest left in the pool
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                out = fn(self._input[:size])
            self._graphs[size] = (graph, out)

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        n = len(rows)
        if rows.shape[1:] != self._input.shape[1:] or rows.dtype != self._input.dtype or n > self._sizes[-1] or n == 0:
            return self.fn(rows)
        graph, out = self._graphs[next(size for size in self._sizes if size >= n)]
        self._input[:n].copy_(rows)
        graph.replay()
        return out[:n].clone()  # the next replay of this graph (the next sub-batch) overwrites `out`

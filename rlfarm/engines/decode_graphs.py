"""CUDA graphs of the static decoder's step: one per (batch bucket, context bucket) of a state, all in its pool.

Two ways to come by them (`StaticDecoder(capture=...)`; "auto": "ahead" until the decoder first sleeps, "first_use"
from then on, as only a sleeping engine keeps losing its graphs):
- "ahead": before a call fills any slot, every pair the call may step is run twice on a side stream (compiling and
  autotuning, cuBLAS and the allocator settling) and captured. The warm-ups write garbage into the state, which is
  why they run before the call. A bench calls `prepare` ahead so that no capture lands in a timed call.
- "first_use": a pair's first two steps in a call run eagerly, on the call's real rows (they are the warm-ups, and
  they compute what a replay would), and its third step captures it; from then on it replays. Only the pairs a
  call steps are captured, and none that it steps fewer than three times. This is for colocated engines: a sleep
  frees the state and its graphs with it, and at the 7B shape "ahead" captured all 80 pairs of the state after
  every wake, where a call steps ~20 (docs/benchmarks.md; at the 1.5B shape in `colocated_2` the step took 6.5 s
  against 11.3 s). A capture records and runs nothing, so it can happen between two steps of a call in flight.

A capture must not be the first run of anything: inductor compiles a smaller batch bucket at its first run and
autotunes inside it, and a capture that does either is invalidated, which leaves the caching allocator with a
capture underway (every later `empty_cache` then fails, and with it a colocated engine's next sleep). Both ways run
a pair eagerly, in the same process and on the same tensors, before they capture it.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import torch

WARM_UPS = 2  # eager runs of a pair before its capture
CAPTURES = ("ahead", "first_use", "auto")


def check_capture(capture: str) -> str:
    if capture not in CAPTURES:
        raise ValueError(f"capture must be one of {CAPTURES}, not {capture!r}")
    return capture


def capture(root, key: tuple, run: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """Record `run` as `root`'s graph for `key`, into the pool all of `root`'s graphs share (a step's temporaries
    do not outlive its replay, and steps replay one at a time)."""
    if root.graph_pool is None:
        root.graph_pool = torch.cuda.graph_pool_handle()
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph, pool=root.graph_pool, capture_error_mode="thread_local"):
        run()
    root.graphs[key] = graph
    return graph


def warm_up(run: Callable[[], None], device: torch.device) -> None:
    """"ahead"'s warm-ups, on a side stream (the state's contents are garbage afterwards)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(WARM_UPS):
            run()
    torch.cuda.current_stream(device).wait_stream(side)


def ahead(root, key: tuple, run: Callable[[], None], device: torch.device,
          captured: Callable[[float], None]) -> torch.cuda.CUDAGraph:
    """"ahead": warm `run` up and capture it; `captured` is called with the seconds both took."""
    started = time.perf_counter()
    warm_up(run, device)
    graph = capture(root, key, run)  # its start waits for the warm-ups
    captured(time.perf_counter() - started)
    return graph


class FirstUse:
    """"first_use"'s step of one pair in one call (a call makes its own: the count of eager steps starts again in
    each, so a pair stepped once in an earlier call is not captured at its first step in this one): eager for its
    first WARM_UPS steps, then captured and replayed. `captured` is called with the seconds of each capture (not
    the eager steps: they are the call's own steps), `eager` after each eager step.
    No other thread runs GPU work during a capture: new weights enter a call only at its pause points between
    blocks of steps (`rlfarm.engines.weight_gate`), never inside a step, where captures happen."""

    def __init__(self, root, key: tuple, run: Callable[[], None], device: torch.device,
                 captured: Callable[[float], None], eager: Callable[[], None] = lambda: None):
        self.root, self.key, self.run, self.device, self.captured, self.eager = root, key, run, device, captured, eager
        self.eager_left = WARM_UPS

    def __call__(self) -> None:
        graph = self.root.graphs.get(self.key)
        if graph is None and self.eager_left > 0:
            self.eager_left -= 1
            self.run()
            self.eager()
            return
        if graph is None:
            torch.cuda.synchronize(self.device)  # the steps queued so far are not the capture's time
            started = time.perf_counter()
            graph = capture(self.root, self.key, self.run)
            self.captured(time.perf_counter() - started)
        graph.replay()

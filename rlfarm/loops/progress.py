"""What a driver has done so far, in one record that a checkpoint saves and a resume restores: named counters,
the wall clock across resumes, the window of the newest rewards (or returns) that the summary and the target
test average, and per-stage timings whose medians go to the summary.

A loop declares its counters by name (`Progress(window=10, updates=0, env_steps=0)`) and reads or adds to them by
name (`progress["updates"]`, `progress.add(env_steps=64)`); `state_dict()` is what goes into a checkpoint's
`extra`, so no loop lists its counters by hand twice."""
from __future__ import annotations

import time
from collections import deque
from typing import Callable

import numpy as np

RESERVED = ("wall_s", "window", "timings")  # keys of the state dict that are not counters


class Progress:
    def __init__(self, window: int, timings: tuple[str, ...] = (), clock: Callable[[], float] = time.monotonic,
                 **counters):
        """`counters`: name → starting value (usually 0; None for a value set once, e.g. the first success rate).
        `timings`: the stage-time keys whose every value is kept for the summary's medians."""
        clash = set(counters) & set(RESERVED)
        if clash:
            raise ValueError(f"counter names {sorted(clash)} are taken by the state dict")
        self.counters = dict(counters)
        self.window: deque[float] = deque(maxlen=window)
        self.timings: dict[str, list[float]] = {key: [] for key in timings}
        self._clock = clock
        self._wall_before = 0.0  # wall time of the incarnations before a resume
        self._started = clock()

    # -- counters -------------------------------------------------------------------------------------
    def __getitem__(self, name: str):
        return self.counters[name]

    def __setitem__(self, name: str, value) -> None:
        if name not in self.counters:
            raise KeyError(f"{name} is not a declared counter")
        self.counters[name] = value

    def add(self, **increments) -> None:
        for name, amount in increments.items():
            self[name] = self.counters[name] + amount

    # -- window and timings -----------------------------------------------------------------------------
    @property
    def window_full(self) -> bool:
        return len(self.window) == self.window.maxlen

    def window_mean(self, empty: float | None = None) -> float | None:
        return float(np.mean(self.window)) if self.window else empty

    def record_timings(self, row: dict) -> None:
        for key, values in self.timings.items():
            if row[key] is not None:  # e.g. mfu on a CPU, which has no peak to measure against
                values.append(row[key])

    def timing_medians(self) -> dict[str, float]:
        return {key: round(float(np.median(values)), 4) for key, values in self.timings.items() if values}

    # -- wall clock -------------------------------------------------------------------------------------
    @property
    def wall_s(self) -> float:
        """Seconds of the run so far, across resumes."""
        return self._wall_before + self.session_s

    @property
    def session_s(self) -> float:
        """Seconds since this process's clock (re)started: its share of `wall_s`."""
        return self._clock() - self._started

    def restart_clock(self) -> None:
        """Start this process's share of the clock now: the clock counts training, not start-up."""
        self._started = self._clock()

    # -- checkpoint ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Flat: the counters by name, then wall_s, window, timings (plain Python values, `weights_only` loads)."""
        return {**self.counters, "wall_s": self.wall_s, "window": list(self.window),
                "timings": {key: list(values) for key, values in self.timings.items()}}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a saved state: counters and window as saved, the clock from the saved wall time."""
        self.counters = {name: state[name] for name in self.counters}
        self.window.clear()
        self.window.extend(state["window"])
        self.timings = {key: list(state["timings"].get(key, [])) for key in self.timings}
        self._wall_before = float(state["wall_s"])
        self.restart_clock()

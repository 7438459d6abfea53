"""One stage clock for every role: cumulative seconds per named stage, the `stage_s` of a role's `stats()`.

`telemetry/stages.py` turns the growth of these seconds between two looks into each stage's share of the interval
and names the bottleneck; so every role that reports "busy vs waiting" reports it through this class, with the
same meaning for the same word (a stage that waits on another role is listed in `telemetry.stages.KINDS`)."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager


class StageClock:
    """Cumulative seconds per named stage. A snapshot counts the stage in progress up to now, so a role blocked in
    one stage for a whole metrics interval (a runner waiting for credits, a learner in a long compile) shows it
    in that interval instead of nothing at all."""

    def __init__(self, *names: str):
        self.seconds = dict.fromkeys(names, 0.0)
        self._current: tuple[str, float] | None = None  # (stage, its start) while one runs
        self._lock = threading.Lock()  # snapshots from other threads see each second once, never a dip

    @contextmanager
    def timing(self, name: str):
        with self._lock:
            self._current = (name, time.perf_counter())
        try:
            yield
        finally:
            with self._lock:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - self._current[1]
                self._current = None

    def timed(self, name: str, work, *args, **kwargs):
        """`work(*args, **kwargs)` timed as stage `name`; its result."""
        with self.timing(name):
            return work(*args, **kwargs)

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            seconds = dict(self.seconds)
            if self._current is not None:
                stage, started = self._current
                seconds[stage] = seconds.get(stage, 0.0) + time.perf_counter() - started
        return seconds

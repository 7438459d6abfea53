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
    in that interval instead of nothing at all.

    Stages nest: a stage timed inside another (a reward model's host copy inside the labeler's "launch") takes its
    seconds out of the outer one, so every second counts once, in the innermost stage, and the shares still add up
    to the whole."""

    def __init__(self, *names: str):
        self.seconds = dict.fromkeys(names, 0.0)
        self._open: list[list] = []  # [stage, since] per stage in progress, innermost last: since = when it last ran
        self._lock = threading.Lock()  # snapshots from other threads see each second once, never a dip

    @contextmanager
    def timing(self, name: str):
        with self._lock:
            now = time.perf_counter()
            if self._open:  # the outer stage pauses while this one runs
                self._credit(self._open[-1], now)
            self._open.append([name, now])
        try:
            yield
        finally:
            with self._lock:
                now = time.perf_counter()
                self._credit(self._open.pop(), now)
                if self._open:  # the outer stage runs again from now
                    self._open[-1][1] = now

    def _credit(self, entry: list, now: float) -> None:
        stage, since = entry
        self.seconds[stage] = self.seconds.get(stage, 0.0) + now - since
        entry[1] = now

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
            if self._open:  # only the innermost stage is running
                stage, since = self._open[-1]
                seconds[stage] = seconds.get(stage, 0.0) + time.perf_counter() - since
        return seconds

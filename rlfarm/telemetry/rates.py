"""Rates for a person to read: a growing count's rate over the last few seconds of (time, count) samples.

Counts arrive in whole chunks (an env runner reports 32 steps at a time), so a rate over one metrics interval
jumps between one and two chunks per interval (32 and 64 steps/s) while the true rate sits in between. Over a
window several intervals long, one chunk more or less moves the rate by a fraction of itself, not by 2x. The
window reaches back to the newest sample at least `window_s` old, so a run whose rows come slower than the window
(a long on-policy cycle) still gets the rate over its last two rows.

metrics.jsonl keeps the per-interval rates the loops compute; only what is shown (live view, periodic log line)
is smoothed."""
from __future__ import annotations

from collections import deque

WINDOW_S = 5.0


class SmoothedRate:
    def __init__(self, window_s: float = WINDOW_S):
        self.window_s = window_s
        self._samples: deque[tuple[float, float]] = deque()

    def add(self, t: float, count: float) -> float | None:
        """Record `count` at time `t` (seconds); the rate over the window ending now, None until two samples span
        some time."""
        if self._samples and t < self._samples[-1][0]:  # a clock that went back (a new process): start over
            self._samples.clear()
        self._samples.append((t, count))
        while len(self._samples) > 2 and self._samples[1][0] <= t - self.window_s:
            self._samples.popleft()
        t0, count0 = self._samples[0]
        if t <= t0:
            return None
        return max(count - count0, 0) / (t - t0)

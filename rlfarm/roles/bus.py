"""The labeler's batching bus: collects items and fires when it holds N units or T seconds have passed
since the first item arrived. Big batches keep the reward model's GPU busy; the timeout bounds latency.

A bus that fires hands over its oldest items up to the first that brings them to N units; the rest stay queued, in
order, and fire as soon as they hold N units again. A labeler that fell behind (a slow model, many runners' credits)
so works its queue off one bus at a time: each call reaches the learner after one bus's model time, and the credits it
returns refill the queue while the next bus is labeled. Handing over the whole queue instead makes one call of every
chunk in flight: nothing delivered for the length of that call, then all of it at once, and no chunk left to gather
the next bus meanwhile."""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any


class Bus:
    def __init__(self, max_items: int, timeout_s: float, clock: Callable[[], float] = time.monotonic):
        if max_items < 1 or timeout_s < 0:
            raise ValueError(f"bus needs max_items >= 1 and timeout_s >= 0, got {max_items}, {timeout_s}")
        self.max_items, self.timeout_s, self.clock = max_items, timeout_s, clock
        self._items: deque[tuple[Any, int, float]] = deque()  # (item, units, arrived at), oldest first
        self._units = 0
        self._cond = threading.Condition()

    def put(self, item: Any, units: int = 1) -> None:
        """Add an item that counts as `units` (e.g. the transitions in a chunk)."""
        with self._cond:
            self._items.append((item, units, self.clock()))
            self._units += units
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return self._units

    def ready(self) -> bool:
        """True when the bus should fire: N units held, or T seconds since the first item."""
        with self._cond:
            return self._ready()

    def _ready(self) -> bool:
        if not self._items:
            return False
        return self._units >= self.max_items or self.clock() - self._items[0][2] >= self.timeout_s

    def take(self, wait_s: float) -> list[Any]:
        """Wait up to `wait_s` for the bus to fire; return its oldest items up to N units (empty list if it did not
        fire)."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            while not self._ready():
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                # Wake at the earlier of the caller's deadline and the bus's own timeout.
                if self._items:
                    left = min(left, max(self._items[0][2] + self.timeout_s - self.clock(), 0.0) + 1e-4)
                self._cond.wait(left)
            items, units = [], 0
            while self._items and units < self.max_items:
                item, size, _ = self._items.popleft()
                items.append(item)
                units += size
            self._units -= units
            return items

    def drain(self) -> list[Any]:
        """Everything held, fired or not (used on shutdown)."""
        with self._cond:
            items = [item for item, _, _ in self._items]
            self._items.clear()
            self._units = 0
            return items

"""The labeler's batching bus: collects items and fires when it holds N units or T seconds have passed
since the first item arrived. Big batches keep the reward model's GPU busy; the timeout bounds latency."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class Bus:
    def __init__(self, max_items: int, timeout_s: float, clock: Callable[[], float] = time.monotonic):
        if max_items < 1 or timeout_s < 0:
            raise ValueError(f"bus needs max_items >= 1 and timeout_s >= 0, got {max_items}, {timeout_s}")
        self.max_items, self.timeout_s, self.clock = max_items, timeout_s, clock
        self._items: list[Any] = []
        self._units = 0
        self._first_at: float | None = None
        self._cond = threading.Condition()

    def put(self, item: Any, units: int = 1) -> None:
        """Add an item that counts as `units` (e.g. the transitions in a chunk)."""
        with self._cond:
            if not self._items:
                self._first_at = self.clock()
            self._items.append(item)
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
        return self._units >= self.max_items or self.clock() - self._first_at >= self.timeout_s

    def take(self, wait_s: float) -> list[Any]:
        """Wait up to `wait_s` for the bus to fire; return its items (empty list if it did not fire)."""
        deadline = time.monotonic() + wait_s
        with self._cond:
            while not self._ready():
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                # Wake at the earlier of the caller's deadline and the bus's own timeout.
                if self._items:
                    left = min(left, max(self._first_at + self.timeout_s - self.clock(), 0.0) + 1e-4)
                self._cond.wait(left)
            items, self._items, self._units, self._first_at = self._items, [], 0, None
            return items

    def drain(self) -> list[Any]:
        """Everything held, fired or not (used on shutdown)."""
        with self._cond:
            items, self._items, self._units, self._first_at = self._items, [], 0, None
            return items

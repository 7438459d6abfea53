"""Where new weights may enter a generation in flight (partial rollouts): only between decode steps.

A weight sync runs in a thread of its own (the engine role's "sync" concurrency group) while `generate` decodes in
another. Copying into the weights while a step reads them would mix two versions inside one forward pass, so the
sync asks for the gate (`swapping`), the decoder lets it through at its next pause point (`pause_point`, between
blocks of decode steps, where the host looks at the device anyway) and waits there until the new weights are in;
then it stamps the new version on the tokens sampled from logits computed with them. Outside a generation the
gate is open: a sync goes through at once.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class WeightGate:
    def __init__(self):
        self._changed = threading.Condition()
        self._generating = False  # a decoder is between pause points: the weights are in use
        self._waiting = 0         # syncs asking to come in
        self._swapping = False    # a sync is writing the weights

    @contextmanager
    def generating(self) -> Iterator[None]:
        """A generation: the weights are in use except at its pause points."""
        with self._changed:
            self._changed.wait_for(lambda: not self._swapping)
            self._generating = True
        try:
            yield
        finally:
            with self._changed:
                self._generating = False
                self._changed.notify_all()

    def pause_point(self) -> bool:
        """Between decode steps: let any waiting sync write the weights, and wait until it did. Returns whether
        one did. Costs one attribute read when no sync waits."""
        if not self._waiting:
            return False
        with self._changed:
            self._generating = False
            self._changed.notify_all()
            self._changed.wait_for(lambda: not self._waiting and not self._swapping)
            self._generating = True
        return True

    def wait_for(self, ready: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until `ready()` (checked again after every swap); False if `timeout_s` passed first."""
        with self._changed:
            return self._changed.wait_for(ready, timeout_s)

    @contextmanager
    def swapping(self) -> Iterator[None]:
        """Write the weights: waits for the generation in flight (if any) to reach a pause point."""
        with self._changed:
            self._waiting += 1
            self._changed.wait_for(lambda: not self._generating and not self._swapping)
            self._waiting -= 1
            self._swapping = True
        try:
            yield
        finally:
            with self._changed:
                self._swapping = False
                self._changed.notify_all()

"""Work handed to a role's own loop thread, run once by whoever takes it first: the loop at its next boundary, or
the caller, who withdraws it when the loop is too slow to start it (a farm learner's checkpoint: the update loop
snapshots between bursts; one stuck inside a burst is snapshotted from the caller's thread instead)."""
from __future__ import annotations

import threading
from collections.abc import Callable


class LoopRequest:
    """Work for the update loop, run once by whoever takes it first: the loop, or the caller withdrawing it."""

    def __init__(self, work: Callable):
        self._work, self._done, self._lock = work, threading.Event(), threading.Lock()
        self._taken, self._value, self._error = False, None, None

    def withdraw(self) -> bool:
        """Take it back before the loop started it (True), or find it started (False: wait for it)."""
        with self._lock:
            taken, self._taken = self._taken, True
        return not taken

    def serve(self) -> None:
        if not self.withdraw():
            return
        try:
            self._value = self._work()
        except BaseException as error:  # noqa: BLE001 - raised again in the caller's thread
            self._error = error
        finally:
            self._done.set()

    def wait(self, timeout: float | None) -> bool:
        return self._done.wait(timeout)

    def result(self):
        if self._error is not None:
            raise self._error
        return self._value

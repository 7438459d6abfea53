"""What every resumable loop does about checkpoints: write one every `run.checkpoint_every_updates` updates
or `run.checkpoint_every_min` minutes (keeping the newest two), and turn SIGTERM into a flag the loop checks
between cycles (it then writes preempted.pt and exits for a requeue). The loop supplies `checkpoint(name)`."""
from __future__ import annotations

import logging
import time

log = logging.getLogger("rlfarm")
KEEP = 2  # periodic checkpoints kept: the newest two (one may be mid-write when the process dies)


class PeriodicCheckpoints:
    def _start_checkpoints(self, updates: int = 0) -> None:
        self._preempt = False
        self._last_checkpoint = (updates, time.monotonic())  # (updates, time) of the last periodic one

    def checkpoint(self, name: str = "final.pt") -> str:
        raise NotImplementedError

    def request_preemption(self) -> None:
        """Signal-handler side: only sets a flag; the loop checkpoints after its current cycle."""
        self._preempt = True

    def _maybe_checkpoint(self, updates: int) -> None:
        every_updates, every_min = self.cfg.run.checkpoint_every_updates, self.cfg.run.checkpoint_every_min
        last_updates, last_time = self._last_checkpoint
        if (every_updates and updates - last_updates >= every_updates) or \
                (every_min and time.monotonic() - last_time >= 60 * every_min):
            path = self.checkpoint(f"step_{updates:09d}.pt")
            self._last_checkpoint = (updates, time.monotonic())
            for old in sorted(self.run.checkpoint_dir.glob("step_*.pt"))[:-KEEP]:
                old.unlink(missing_ok=True)
            log.info("checkpoint %s", path)

"""What every resumable loop does about checkpoints: write one every `run.checkpoint_every_updates` updates
or `run.checkpoint_every_min` minutes (keeping the newest two), and turn SIGTERM and the first Ctrl-C into a flag
the loop checks between cycles (it then writes preempted.pt and exits: 75 for a requeue, 130 after Ctrl-C; a second
Ctrl-C exits at once). The loop supplies `checkpoint(name)`; the
role writes the file with `rlfarm.checkpoint_files.write_checkpoint` (atomic, with a sha256 sidecar that
retention deletes with it, and that a resume verifies).

A loop whose learner keeps working while it saves (off-policy) also supplies `start_checkpoint(name)`, which
returns a `concurrent.futures.Future` of the path (a Ray ref's `.future()`): the periodic checkpoint is then
requested and the loop keeps going; it is logged, and the older ones rotated out, once it has landed. At most
one is in flight; one that takes longer than `checkpoint_late_s` is warned about once.

Slurm signals every process of the job, Ray's workers too, so a role may die of the same SIGTERM before the
driver gets to its checkpoint: `until_preempted` turns any failure after the signal into the preemption exit,
resuming from the newest checkpoint on disk."""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from concurrent.futures import Future, wait

from rlfarm.checkpoint_files import remove_checkpoint
from rlfarm.errors import Preempted
from rlfarm.run import newest_checkpoint

log = logging.getLogger("rlfarm")
KEEP = 2  # periodic checkpoints kept: the newest two (one may be mid-write when the process dies)
SIGNAL_GRACE_S = 2.0  # after a role failure: how long to wait for a SIGTERM that may explain it
PREEMPT_POLL_S = 0.5  # how often a long wait on a stage looks for SIGTERM


def step_name(updates: int) -> str:
    """A periodic checkpoint's file name (and one written when a node is lost): sorted by update."""
    return f"step_{updates:09d}.pt"


class PeriodicCheckpoints:
    """Mixed into a loop that has `cfg` (run.checkpoint_every_*), `run` (dir, checkpoint_dir) and
    `checkpoint(name, **args) -> path` (which asks its learner to save); call `_start_checkpoints` in __init__
    and `schedule_checkpoints_from(updates)` on resume."""

    checkpoint_late_s: float | None = None  # warn once about a periodic checkpoint in flight this long
    _preempt = False  # SIGTERM or Ctrl-C arrived: checkpoint after this cycle, then stop
    _interrupted = False  # ... and it was Ctrl-C (the exit says "interrupted", 130)

    def _start_checkpoints(self, updates: int = 0) -> None:
        self._preempt = self._interrupted = False
        self._in_flight: tuple[str, Future, float] | None = None  # (name, future path, requested at)
        self._late_warned = False
        self.schedule_checkpoints_from(updates)

    def schedule_checkpoints_from(self, updates: int) -> None:
        """Count the next periodic checkpoint from `updates`, now: at the start, after each one, and on resume
        (from the checkpoint's update, so the resumed run keeps the schedule the interrupted one had)."""
        self._last_checkpoint = (updates, time.monotonic())  # (updates, time) of the last checkpoint

    def request_preemption(self) -> None:
        """Signal-handler side: only sets a flag; the loop checkpoints after its current cycle."""
        self._preempt = True

    @contextlib.contextmanager
    def stopping_on_signals(self):
        """While the loop runs: SIGTERM (Slurm) and the first Ctrl-C checkpoint and stop; a second Ctrl-C stops at
        once (KeyboardInterrupt). The previous handlers come back after (a sweep runs its next job in this process)."""
        previous = signal.signal(signal.SIGTERM, lambda *_: self.request_preemption()), \
            signal.signal(signal.SIGINT, self._ctrl_c)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous[0])
            signal.signal(signal.SIGINT, previous[1])

    def _ctrl_c(self, *_) -> None:
        if self._preempt:  # asked to stop already: this one means now
            raise KeyboardInterrupt
        self._interrupted = True
        self.request_preemption()
        # a raw write: the handler may run while the main thread holds the logging lock
        os.write(2, b"\nCtrl-C: writing a checkpoint, then stopping (Ctrl-C again stops at once, without it)\n")

    def start_checkpoint(self, name: str) -> Future:
        """Ask for a checkpoint; the future holds its path. Default: written now, by `checkpoint(name)` (a
        synchronous loop's learner is idle between cycles)."""
        written: Future = Future()
        written.set_result(self.checkpoint(name))
        return written

    def _checkpoint_due(self, updates: int) -> bool:
        every_updates, every_min = self.cfg.run.checkpoint_every_updates, self.cfg.run.checkpoint_every_min
        last_updates, last_time = self._last_checkpoint
        return bool((every_updates and updates - last_updates >= every_updates) or
                    (every_min and time.monotonic() - last_time >= 60 * every_min))

    def _maybe_checkpoint(self, updates: int) -> None:
        self._land_checkpoint()
        if self._in_flight is None and self._checkpoint_due(updates):
            name = step_name(updates)
            self._in_flight = (name, self.start_checkpoint(name), time.monotonic())
            self._late_warned = False
            self.schedule_checkpoints_from(updates)
            self._land_checkpoint()

    def _land_checkpoint(self) -> None:
        """The periodic checkpoint in flight has been written: log it and keep the newest KEEP."""
        if self._in_flight is None:
            return
        name, future, requested = self._in_flight
        if not future.done():
            waited = time.monotonic() - requested
            if self.checkpoint_late_s is not None and waited > self.checkpoint_late_s and not self._late_warned:
                self._late_warned = True
                log.warning("checkpoint %s: the learner has not written it after %.0f s; no other periodic "
                            "checkpoint is requested until it is", name, waited)
            return
        self._in_flight = None
        path = future.result()  # a save that raised fails the run, as it would have synchronously
        for old in sorted(self.run.checkpoint_dir.glob("step_*.pt"))[:-KEEP]:
            remove_checkpoint(old)  # with its .sha256
        log.info("checkpoint %s", path)

    def _land_last_checkpoint(self, timeout_s: float) -> None:
        """At the loop's end: wait (at most timeout_s) for the periodic checkpoint in flight, so it is logged and
        rotated like the others instead of landing unannounced after the run."""
        if self._in_flight is not None:
            wait([self._in_flight[1]], timeout=timeout_s)
            self._land_checkpoint()

    def _after_update(self, updates: int, **checkpoint_args) -> None:
        """Between cycles: a periodic checkpoint when one is due; after SIGTERM, preempted.pt and the exit."""
        self._maybe_checkpoint(updates)
        if self._preempt:
            raise self._preempted(**checkpoint_args)

    def _wait_unless_preempted(self, refs: list, num_returns: int | None = None,
                               timeout_s: float | None = None) -> list:
        """ray.wait for `num_returns` of `refs` (all by default), but SIGTERM ends the wait at once: a stage that
        takes minutes (a rollout or a generation with a big policy) is dropped, and preempted.pt holds the state
        before it. Returns the ready refs (fewer than asked for once `timeout_s` has passed, if given)."""
        import ray

        wanted = len(refs) if num_returns is None else num_returns
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            ready, _ = ray.wait(list(refs), num_returns=wanted, timeout=PREEMPT_POLL_S)
            if self._preempt:
                raise self._preempted()
            if len(ready) >= wanted or (deadline is not None and time.monotonic() >= deadline):
                return ready

    def _preempted(self, **checkpoint_args) -> Preempted:
        """The exception that ends a preempted run: with preempted.pt, or, when a role died with the signal,
        with the newest checkpoint already on disk."""
        try:
            return Preempted(self.checkpoint("preempted.pt", **checkpoint_args), self.run.dir, self._interrupted)
        except Exception as error:  # noqa: BLE001 - a role that died with the signal cannot write one
            newest = newest_checkpoint(self.run.dir)
            log.warning("preempted, but preempted.pt could not be written (%s); a resume continues from %s",
                        str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__,
                        newest or "the start")
            return Preempted(str(newest) if newest else None, self.run.dir, self._interrupted)

    @contextlib.contextmanager
    def until_preempted(self, **checkpoint_args):
        """Wrap a loop's body: after SIGTERM, a failure (a role killed by the same signal) is a preemption."""
        try:
            yield
        except Preempted:
            raise
        except Exception:
            # A role killed by the job's SIGTERM can fail a call before this process's own handler has run.
            deadline = time.monotonic() + SIGNAL_GRACE_S
            while not self._preempt and time.monotonic() < deadline:
                time.sleep(0.05)
            if self._preempt:
                raise self._preempted(**checkpoint_args) from None
            raise

"""The synchronous driver, written once for the families that run one cycle after another (LLM GRPO/PPO,
gymnasium PPO, VLA GRPO): cycles until the budget, the target or `run.max_wall_s`; a live view; periodic
checkpoints and SIGTERM (`PeriodicCheckpoints`); the loop's `Progress` saved with every checkpoint and restored
on resume, the checkpoint schedule continuing from the restored update.

A family sets `progress` (through `_begin`, its counters including `updates`), `target` (the window mean that
ends the run early, or None) and `title`, and fills in its stages (the live view shows its family's columns):
    _warm_up()                 start-up the clock does not count (the actors get the learner's first weights)
    _has_work() -> bool        another cycle fits the budget (default: updates < algo.max_updates)
    _step() -> dict            one cycle as named stages; what it measured
    _record(metrics) -> dict   counts the cycle into `progress`; the row for metrics.jsonl and the live view
    _summary(row) -> dict      summary.json's numbers (row: the last one, {} when no cycle ran)
    _save(path, extra) / _load(path) -> extra: the learner writes and reads the checkpoint."""
from __future__ import annotations

import logging

import ray

from rlfarm.loops.checkpoints import PeriodicCheckpoints
from rlfarm.loops.progress import Progress
from rlfarm.telemetry.live import LiveView

log = logging.getLogger("rlfarm")


class SyncLoop(PeriodicCheckpoints):
    progress: Progress
    target: float | None
    title: str

    def _begin(self, progress: Progress, resume_from: str | None) -> None:
        """End of __init__, once the roles are up: checkpoints start; a resume restores the progress."""
        self.progress = progress
        self._start_checkpoints()
        if resume_from:
            self._resume(resume_from)

    def train(self) -> dict:
        self._warm_up()
        self.progress.restart_clock()  # the clock counts training, not the roles' start-up (imports, model build)
        row: dict = {}
        with self.until_preempted(), LiveView(self.title, self.cfg.run.live, columns=self.run.family.columns) as view:
            while self._has_work():
                row = self._record(self._step())
                self.run.log(row)
                view.update(row)
                self._after_update(self.progress["updates"])
                if self._done():
                    break
        return self._summary(row)

    def _has_work(self) -> bool:
        return self.progress["updates"] < int(self.cfg.algo.max_updates)

    def _done(self) -> bool:
        """Out of time, or the target reached by the mean of a full window."""
        max_wall_s = self.cfg.run.max_wall_s
        if max_wall_s and self.progress.wall_s > max_wall_s:
            log.info("run.max_wall_s=%s reached: stopping", max_wall_s)
            return True
        return bool(self.target is not None and self.progress.window_full
                    and self.progress.window_mean() >= self.target)

    # -- checkpoints ---------------------------------------------------------------------------------
    def checkpoint(self, name: str = "final.pt") -> str:
        return self._save(str(self.run.checkpoint_dir / name), self.progress.state_dict())

    def _resume(self, path: str) -> None:
        """Continue after the checkpoint's update: the learner restores its state, the progress continues, the
        rows logged after the checkpoint are dropped, and the next periodic checkpoint is due N updates on."""
        self.progress.load_state_dict(self._load(path))
        updates = self.progress["updates"]
        self.schedule_checkpoints_from(updates)
        self.run.truncate_metrics(after_step=self.progress[self.run.step_key])
        log.info("resumed from %s after update %d", path, updates)

    def _save(self, path: str, extra: dict) -> str:
        return ray.get(self.learner.save.remote(path, extra))

    def _load(self, path: str) -> dict:
        return ray.get(self.learner.load.remote(path))

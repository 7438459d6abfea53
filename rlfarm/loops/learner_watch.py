"""A learner that answers stats but makes no progress while work waits for it (stalled, or compiling) is named
once, and named again when it moves: the off-policy loop waits for it (SIGTERM and run.max_wall_s still end the
run), unlike a learner that does not answer at all, which ends the run (rlfarm/loops/supervision.py)."""
from __future__ import annotations

import logging
import time

from rlfarm.loops.supervision import Supervisor

log = logging.getLogger("rlfarm")


class LearnerWatch:
    def __init__(self, supervisor: Supervisor, deadline_s: float):
        self.supervisor, self.deadline_s = supervisor, deadline_s
        self.seen: tuple[tuple, float] = ((), time.monotonic())  # (updates, stored), since when
        self.warned = False

    def look(self) -> None:
        """After each poll: warn once when neither updates nor stored has moved for a deadline with work waiting."""
        stats, now = self.supervisor.learner.stats, time.monotonic()
        seen, since = self.seen
        progress = (stats.get("updates"), stats.get("stored"))
        work = self.work(stats)
        if progress != seen or not work:
            if self.warned:
                log.info("the learner is making progress again after %.0f s", now - since)
            self.seen, self.warned = (progress, now), False
        elif now - since > self.deadline_s and not self.warned:
            self.warned = True
            log.warning("the learner (pid %s) has made no progress for %.0f s with %s (stalled, or compiling): "
                        "waiting for it; SIGTERM and run.max_wall_s still end the run",
                        self.supervisor.learner.pid, now - since, work)

    def work(self, stats: dict) -> str | None:
        """What waits for the learner: the updates it owes (when it reports them), else the runners' chunks not
        acked yet while no labeler holds any (they are in the learner's inbox or wait for its updates)."""
        if "owed" in stats:
            return f"{stats['owed']:,} updates owed" if stats["owed"] > 0 else None
        sup = self.supervisor
        unacked = sum(w.stats.get("in_flight", 0) for w in sup.of("env_runner"))
        at_labelers = any(w.stats.get("queued", 0) or w.stats.get("in_call_s", 0) for w in sup.of("labeler"))
        return f"{unacked} chunks not acked" if unacked and not at_labelers else None

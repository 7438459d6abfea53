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
    _save(path, extra) / _load(path) -> extra: the learner writes and reads the checkpoint.

Every wait on a role goes through `_ask` (rlfarm.loops.deadlines): no deadline on the work, one on the roles'
liveness (`run.role_timeout_s` to answer stats), and SIGTERM ends it. The family names its roles in `watched`
("learner", "env_runner 0", "engine 1", ...; written to roles.json with their pids) and which of them Ray restarts
(`restartable`, started with `max_restarts`): `_restarted(name)` waits for such a role to come back and lets the
family re-wire it (`_rewire`: the newest weights); the family then makes its part of the cycle again. A learner that
dies or hangs ends the run with one line naming it and the resume command; its newest checkpoint is on disk."""
from __future__ import annotations

import json
import logging

import ray

from rlfarm.loops.checkpoints import PeriodicCheckpoints, step_name
from rlfarm.loops.deadlines import RoleFailed, Watched, ask, described
from rlfarm.loops.progress import Progress
from rlfarm.loops.ray_calls import RAY, RayCalls
from rlfarm.loops.supervision import (NodeLost, checkpoint_at_node_loss, node_lost_line, node_verdict,
                                      wait_until_restarted)
from rlfarm.telemetry.live import LiveView

log = logging.getLogger("rlfarm")


class SyncLoop(PeriodicCheckpoints):
    progress: Progress
    target: float | None
    title: str

    watched: dict[str, Watched]  # every role by name
    restartable: set[str] = set()  # the names Ray restarts
    calls: RayCalls = RAY  # how the restart and lost-node waits reach Ray (stand-ins in the unit tests)

    def _begin(self, progress: Progress, resume_from: str | None) -> None:
        """End of __init__, once the roles are up: their pids known (roles.json), checkpoints start; a resume
        restores the progress."""
        self.progress = progress
        self._start_checkpoints()
        self.restarts = dict.fromkeys(self.watched, 0)
        self.nodes: dict[str, str | None] = {}  # role name → the id of the node it runs on (roles.json)
        names = list(self.watched)
        started = self._ask([(n, self.watched[n].actor.stats.remote()) for n in names], "stats",
                            float(self.cfg.run.restart_timeout_s))  # the constructors ran: models built, envs made
        for name, stats in zip(names, started):
            self.watched[name].pid = int(stats["pid"])
        self._write_roles_file()
        if resume_from:
            self._resume(resume_from)

    def train(self) -> dict:
        self._warm_up()
        self.progress.restart_clock()  # the clock counts training, not the roles' start-up (imports, model build)
        row: dict = {}
        try:
            with self.until_preempted(), LiveView(self.title, self.cfg.run.live, columns=self.run.family.columns) as view:
                while self._has_work():
                    row = self._record(self._step())
                    self.run.log(row)
                    view.update(row)
                    self._after_update(self.progress["updates"])
                    if self._done():
                        break
        except NodeLost:  # its line names the resume command
            raise
        except RoleFailed as error:  # a learner that died or hangs, a worker out of restarts: resume from disk
            raise RoleFailed(f"{error}; resume from the newest checkpoint: rlfarm train resume={self.run.dir}") \
                from None
        return self._summary(row)

    # -- waits and restarts --------------------------------------------------------------------------
    def _ask(self, calls: list[tuple[str, ray.ObjectRef]], what: str, timeout_s: float | None = None,
             interruptible: bool = True) -> list:
        """The named roles' answers: with timeout_s a deadline on the answers (short calls, start-up), without
        one a deadline on the liveness of the roles asked (`run.role_timeout_s`); SIGTERM ends the wait (unless
        not `interruptible`: the checkpoint SIGTERM asks for)."""
        interrupted = (lambda: self._preempt) if interruptible else None
        if timeout_s is not None:
            return ask(calls, what, timeout_s, interrupted)
        return ask(calls, what, float(self.cfg.run.role_timeout_s), interrupted, self.watched)

    def _restarted(self, name: str) -> None:
        """Role `name` died: wait (run.restart_timeout_s) for Ray to bring it back, re-wire it (`_rewire`), say so
        in one line. A role that is not restartable, or out of restarts, ends the run; so does a lost node (its
        roles are waited for run.role_timeout_s, then one line names the node and them)."""
        role, run_cfg = self.watched[name], self.cfg.run
        node, lost_wait_s = self.nodes.get(name), float(run_cfg.role_timeout_s)
        interrupted = lambda: self._preempt  # noqa: E731
        before = role.pid
        try:
            if name not in self.restartable or self.restarts[name] >= int(run_cfg.max_restarts):
                more = "" if name not in self.restartable else f" after {self.restarts[name]} restarts (run.max_restarts)"
                raise NodeLost.or_else(node_verdict(self.calls, role.actor, node, lost_wait_s, interrupted),
                                       f"{described(name, role)} died{more}")
            role.pid = int(wait_until_restarted(self.calls, described(name, role), role.actor, before, node,
                                                float(run_cfg.restart_timeout_s), lost_wait_s, interrupted))
        except NodeLost as lost:
            raise NodeLost(lost.node, self._node_lost(lost.node, node)) from None
        self.restarts[name] += 1
        self._rewire(name)
        log.warning("%s (pid %s) died; restarted as pid %s", name, before, role.pid)
        self._write_roles_file()

    def _node_lost(self, label: str, node: str) -> str:
        """The lost node's line, written once the learner (on another node) has checkpointed where possible: a
        resume then continues from this update, not from the last periodic checkpoint."""
        checkpoint_at_node_loss(label, node, self.nodes.get("learner"),
                                lambda: self.checkpoint(step_name(self.progress["updates"])))
        names = [role for role, where in self.nodes.items() if where == node]
        return node_lost_line(label, names, float(self.cfg.run.role_timeout_s), self.run.dir)

    def _rewire(self, name: str) -> None:
        """A restarted role gets what its constructor does not give it (the newest weights)."""

    def _write_roles_file(self) -> None:
        """`roles.json` in the run dir: which process, on which node, runs which role now (for `kill`, py-spy,
        tests)."""
        table = []
        for name, role in self.watched.items():
            kind, _, index = name.rpartition(" ")
            kind, index = (kind.replace(" rank", ""), int(index)) if index.isdigit() else (name, 0)
            self.nodes[name] = self.calls.node_of(role.actor) or self.nodes.get(name)
            table.append({"role": kind, "index": index, "pid": role.pid, "node": self.nodes[name],
                          "restarts": self.restarts[name]})
        path = self.run.dir / "roles.json"
        path.with_suffix(".tmp").write_text(json.dumps(table, indent=1))
        path.with_suffix(".tmp").replace(path)

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
        return self._ask([("learner", self.learner.save.remote(path, extra))], f"save {path}", interruptible=False)[0]

    def _load(self, path: str) -> dict:
        return self._ask([("learner", self.learner.load.remote(path))], f"load {path}")[0]

"""Off-policy driver: act → label → learn run concurrently inside the roles; this loop only starts them,
watches their counters, logs, and stops them. Data never passes through here.

The driver never waits on a role without a deadline (`run.role_timeout_s`, rlfarm/loops/deadlines.py): a runner
or labeler that does not answer, or a labeler stuck in one reward-model call, is named and restarted (or ends the
run once its restarts are used up); a learner that does not answer ends the run with one line, and one that answers
but makes no progress is named and waited for. Periodic checkpoints are requested and land while the loop keeps
polling. SIGTERM and `run.max_wall_s` end the run within 30 s in every state: every wait looks at them, the end of
a run out of time is bounded by the wind-down (what could not be labeled by then is counted in the summary), and
preempted.pt / final.pt are awaited with a deadline. Each metrics row says where the time went, per stage, and
names the bottleneck (rlfarm/telemetry/stages.py)."""
from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from typing import Callable

import ray
from omegaconf import DictConfig

from rlfarm.loops.checkpoints import PeriodicCheckpoints, step_name
from rlfarm.loops.deadlines import SLICE_S, Interrupted, RoleFailed, RoleUnresponsive
from rlfarm.loops.learner_watch import LearnerWatch
from rlfarm.loops.ledger import MAX_INCARNATIONS, Ledger, even_shares
from rlfarm.loops.offpolicy_metrics import OffPolicyMetrics, accounted
from rlfarm.loops.progress import Progress
from rlfarm.loops.ray_calls import RAY, RayCalls
from rlfarm.loops.rewiring import Rewiring
from rlfarm.loops.roles import OffPolicyRoles, start_offpolicy_roles
from rlfarm.loops.supervision import Supervisor, Worker
from rlfarm.run import Run, newest_checkpoint
from rlfarm.telemetry.live import LiveView
from rlfarm.topology import PlacedTopology

log = logging.getLogger("rlfarm")

RETURN_WINDOW = 10       # episode_return_mean is over the last 10 finished episodes
POLL_WAIT_S = 2.0        # a metrics tick waits this long at most for the roles' stats, then uses the newest it has
WIND_DOWN_S = 15.0       # after run.max_wall_s: runners stop (first third), the tail is stored (second), owed updates
LAST_SAVE_S = 8.0        # ... and final.pt gets the rest, at least this: the run ends within ~30 s of its budget
PREEMPT_SAVE_S = 15.0    # SIGTERM → preempted.pt within this (Slurm kills the job ~30 s after its signal)
CHECKPOINT_IO_S = 120.0  # final.pt at a normal end, a resume's load: a big replay buffer takes a while to move
STALLED_FLUSHES = 2      # the tail's flush gives up after this many role_timeout_s without anything settled
RoleStarter = Callable[[DictConfig, PlacedTopology, str], OffPolicyRoles]


class OffPolicyLoop(PeriodicCheckpoints):
    def __init__(self, cfg: DictConfig, run: Run, placed: PlacedTopology, resume_from: str | None = None,
                 start_roles: RoleStarter = start_offpolicy_roles, calls: RayCalls = RAY):
        """`start_roles` and `calls` are the seam to Ray (the unit tests pass fake roles and stand-in calls)."""
        self.cfg, self.run, self.calls = cfg, run, calls
        self.deadline_s = float(cfg.run.role_timeout_s)
        self.checkpoint_late_s = self.deadline_s
        self.roles = start_roles(cfg, placed, str(run.dir / "quarantine"))
        learners = self.roles.learners  # rank 0 leads; every rank is watched, its counts merged into the learner's
        self.supervisor = Supervisor(learners.lead, self.roles.runners, self.roles.labelers,
                                     int(cfg.run.max_restarts), run.dir / "roles.json",
                                     max_incarnations=MAX_INCARNATIONS, calls=calls, learner_ranks=learners.others,
                                     merge_stats=learners.merge_stats, lost_node_wait_s=self.deadline_s,
                                     checkpoint=lambda: self.checkpoint(  # when a node is lost
                                         step_name(self.supervisor.learner.stats.get("updates", 0))))
        self.ledger = Ledger(self.supervisor)
        self.rewiring = Rewiring(self.roles, self.supervisor, self.ledger, self._ask_all)
        self.learner_watch = LearnerWatch(self.supervisor, self.deadline_s)
        # epoch: how many times the run was resumed (it keys the runners' chunk seqs apart across resumes)
        self.progress = Progress(window=RETURN_WINDOW, episodes=0, epoch=0)
        self.metrics = OffPolicyMetrics(self.supervisor, self.ledger, self.progress, int(cfg.total_env_steps))
        self.target = cfg.algo.get("target_return")  # the runners stop once the return window reaches it
        self._reached_target = False
        self._end_by: float | None = None  # run.max_wall_s reached: when the wind-down must be over
        self._recovering = True            # dead or stuck workers are restarted (not while the run ends)
        self._left_behind: set[str] = set()  # workers not restarted because the run is ending (named once each)
        self._start_checkpoints()
        if resume_from:
            self._resume(resume_from)

    # -- checkpoints ---------------------------------------------------------------------------------
    def _resume(self, path: str) -> None:
        """Continue from a checkpoint: every learner rank restores itself; counters continue from what they had
        stored."""
        learners = self.roles.learners
        self.progress.load_state_dict(self._ask_all(learners.load_calls(path), f"load {path}", CHECKPOINT_IO_S)[0])
        self.progress.add(epoch=1)
        stats = learners.merged(self._ask_all(learners.stats_calls(), "stats"))
        settled = self.metrics.resumed(stats)
        self.schedule_checkpoints_from(stats["updates"])
        self.run.truncate_metrics(after_step=settled)
        log.info("resumed from %s at %d env steps, %d updates", path, settled, stats["updates"])

    def checkpoint(self, name: str = "final.pt", with_buffer: bool | None = None) -> str | None:
        """Write `name` and return its path. final.pt that is not written within its deadline (PREEMPT_SAVE_S once
        SIGTERM arrives) is named and left out (None: the summary is still written); any other late save raises."""
        ref, what = self._save(name, with_buffer), f"save {name}"
        try:
            if name != "final.pt":
                return self.calls.ask_one("the learner", ref, what, self._save_deadline_s(name))
            try:
                return self.calls.ask_one("the learner", ref, what, self._save_deadline_s(name), self._signalled)
            except Interrupted:  # SIGTERM: the job ends soon; final.pt gets what preempted.pt would
                return self.calls.ask_one("the learner", ref, what, PREEMPT_SAVE_S)
        except RoleUnresponsive as late:
            if name != "final.pt":
                raise
            log.warning("%s: the run ends without it (a resume continues from %s)", late,
                        newest_checkpoint(self.run.dir) or "the start")
            return None

    def start_checkpoint(self, name: str) -> Future:
        """A periodic checkpoint: requested, not waited for (PeriodicCheckpoints lands it)."""
        return self._save(name).future()

    def _save(self, name: str, with_buffer: bool | None = None) -> ray.ObjectRef:
        if with_buffer is None:
            with_buffer = bool(self.cfg.run.checkpoint_buffer)
        ((_, ref),) = self.roles.learners.save_calls(str(self.run.checkpoint_dir / name), self.progress.state_dict(),
                                                     with_buffer=with_buffer)  # rank 0 writes the others' parts
        return ref

    def _save_deadline_s(self, name: str) -> float:
        if name == "preempted.pt":
            return PREEMPT_SAVE_S
        if self._end_by is not None:  # out of time: what is left of the wind-down
            return max(self._end_by - time.monotonic(), LAST_SAVE_S)
        return max(self.deadline_s, CHECKPOINT_IO_S)

    # -- the run -------------------------------------------------------------------------------------
    def train(self) -> dict:
        total = int(self.cfg.total_env_steps)
        self._start_roles(max(total - self.metrics.offset["env_steps"], 0))              # 0. share out the steps
        title = f"rlfarm · {self.cfg.algo.name} · {self.cfg.env.id} · {self.cfg.topology.name}"
        view = LiveView(title, self.cfg.run.live, columns=self.run.family.columns, total_env_steps=total)
        with self.until_preempted(with_buffer=True), view:
            while not self._finished():                                                   # 1. act/label/learn
                row = self._record()
                view.update(row)
                self._after_update(row["updates"], with_buffer=True)
            self._flush()                                                                 # 2. label + store the tail
            self._recovering = False
            for actor in self.roles.labelers:
                actor.stop.remote()  # a flag each role reads; what they do next is awaited in _wait
            self.roles.learners.stop()
            self._wait()                                                                  # 3. owed updates
            self._land_last_checkpoint(self._save_deadline_s("step"))
            row = self._record()
            view.update(row)
        target = {} if self.target is None else {"target_return": self.target, "reached_target": self._reached_target}
        return self.metrics.summary(row, target)                                          # 4. summary

    # -- stages -------------------------------------------------------------------------------------
    def _start_roles(self, env_steps: int) -> None:
        """Every role's run(): the runners share `env_steps` out evenly; then every role's pid, for roles.json."""
        sup, ledger = self.supervisor, self.ledger
        ledger.start_epoch(self.progress["epoch"], even_shares(env_steps, len(self.roles.runners)))
        for rank, done in zip(sup.learners, self.roles.learners.run()):
            rank.done = done
        for worker in sup.of("labeler"):
            worker.done = worker.actor.run.remote()
        for worker in sup.of("env_runner"):
            worker.done = worker.actor.run.remote(ledger.shares[worker.index], ledger.first_seq(0),
                                                  ledger.runner_key(worker, 0))
        self._poll(wait_s=self.deadline_s)
        if not sup.learner.stats:
            raise RoleUnresponsive(f"the learner did not answer stats within {self.deadline_s:g} s")
        sup.write_roles_file()

    def _finished(self) -> bool:
        """One tick: wait a metrics interval for the runners, watch the roles; True once the runners are done
        (or, out of time, once the wind-down's first third has passed for a runner that does not stop)."""
        self.calls.wait(self._runs("env_runner"), num_returns=len(self.roles.runners),
                        timeout=self.cfg.run.metrics_interval_s)
        self._watch()
        self._check_clock()
        self._check_target()
        _, running = self.calls.wait(self._runs("env_runner"), num_returns=len(self.roles.runners), timeout=0)
        if running and self._wind_down_past(1 / 3):
            names = ", ".join(w.name for w in self.supervisor.of("env_runner") if w.done in set(running))
            log.warning("%s did not stop within %.0f s of run.max_wall_s: the run ends without their last chunk",
                        names, WIND_DOWN_S / 3)
            return True
        return not running

    def _check_clock(self) -> None:
        if self._end_by is None and self._out_of_time():
            self._stop_acting()

    def _check_target(self) -> None:
        """algo.target_return reached: the runners stop after their current chunk; that tail is labeled and learned
        from as at any normal end."""
        mean = self.progress.window_mean()
        if self.target is None or self._reached_target or mean is None or mean < self.target:
            return
        self._reached_target = True
        log.info("the mean return of the last %d episodes reached algo.target_return=%g (%.1f): stopping the env "
                 "runners", RETURN_WINDOW, self.target, mean)
        for runner in self.roles.runners:
            runner.stop.remote()

    def _stop_acting(self) -> None:
        """Time budget spent: runners stop after their current chunk; the tail is labeled and stored as far as the
        wind-down allows. Dead workers are not restarted any more."""
        log.info("run.max_wall_s=%g reached: stopping the env runners (the run ends within %.0f s)",
                 self.cfg.run.max_wall_s, WIND_DOWN_S + LAST_SAVE_S)
        self._end_by = time.monotonic() + WIND_DOWN_S
        self._recovering = False
        for runner in self.roles.runners:
            runner.stop.remote()  # a flag: a runner waiting for credits sees it within 0.1 s

    def _flush(self) -> None:
        """Wait until every transition the runners produced is stored (or quarantined) by the learner. A stuck
        labeler is restarted meanwhile and its chunks re-sent. Bounded: out of time, by the wind-down; otherwise
        after STALLED_FLUSHES deadlines with nothing settled. What is missing then is said, and counted in the
        summary (transitions_unlabeled)."""
        sup = self.supervisor
        settled_before, progress_at, recoveries = -1, time.monotonic(), len(sup.recoveries)
        while True:
            self._check_signal()
            self._check_clock()
            self._poll(wait_s=SLICE_S / 2)
            self._watch()
            learner = sup.learner.stats
            produced = self._produced()
            # After a resume the learner's counts include what it had settled before (the offset), the runners'
            # count only this epoch: compare like with like, or the tail is dropped while still in flight.
            settled = accounted(learner) - self.metrics.offset["produced"] - self.ledger.settled_by_dead(learner)
            if settled >= produced:
                return
            now = time.monotonic()
            if settled != settled_before or len(sup.recoveries) != recoveries:  # a recovery re-sent chunks
                settled_before, progress_at, recoveries = settled, now, len(sup.recoveries)
            if self._wind_down_past(2 / 3) or now - progress_at > STALLED_FLUSHES * self.deadline_s:
                why = ("run.max_wall_s" if self._end_by is not None
                       else f"nothing reached the learner for {now - progress_at:.0f} s")
                log.warning("%s of %s transitions produced were not labeled and stored by the end (%s); the "
                            "summary counts them (transitions_unlabeled)", f"{produced - settled:,}",
                            f"{produced:,}", why)
                return
            time.sleep(SLICE_S / 2)

    def _wait(self) -> None:
        """The learner's owed updates on the stored tail, and every labeler's run() returning. Waits while the
        learner keeps updating (at most a deadline without progress; out of time, the wind-down); whoever is not
        done then is named and left behind."""
        sup = self.supervisor
        waiting = {**{rank.done: _learner_name(rank) for rank in sup.learners},
                   **{w.done: w.name for w in sup.of("labeler")}}
        updates, progress_at = None, time.monotonic()
        while True:
            self._check_signal()
            self._check_clock()
            _, pending = self.calls.wait(list(waiting), num_returns=len(waiting), timeout=SLICE_S)
            if not pending:
                break
            self._poll(wait_s=SLICE_S / 2)
            now = time.monotonic()
            if sup.learner.stats["updates"] != updates:
                updates, progress_at = sup.learner.stats["updates"], now
            if self._wind_down_past(1.0) or (self._end_by is None and now - progress_at > self.deadline_s):
                why = "run.max_wall_s" if self._end_by is not None else f"no progress for {now - progress_at:.0f} s"
                log.warning("%s not done (%s): the run ends without waiting for it",
                            ", ".join(waiting[ref] for ref in pending), why)
                break
        self._watch()

    # -- watching the roles ---------------------------------------------------------------------------
    def _watch(self) -> None:
        """Name stuck roles (restart them, or end the run); restart-and-rewire dead workers; fail the run on any
        other error (or a death past max_restarts)."""
        self._supervise()
        noticed = time.monotonic()  # recovery time counts from here for every worker found dead now
        for worker in self.supervisor.dead():
            if self._recovering:
                self._recover(worker, noticed)
            else:
                self._leave_behind(worker, "died")
        learners = {rank.done: _learner_name(rank) for rank in self.supervisor.learners}
        refs = [*learners, *(w.done for w in self.supervisor.workers)]
        ready, _ = self.calls.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            try:
                self.calls.get(ref)
            except ray.exceptions.RayActorError:
                if ref in learners:
                    raise RoleFailed(f"{learners[ref]} died; resume from its last checkpoint: "
                                     f"rlfarm train resume={self.run.dir}") from None
                # a worker that died after the look above: recovered on the next tick
            except ray.exceptions.RayError as error:
                raise RoleFailed(_one_line(error)) from None

    def _supervise(self) -> None:
        """Roles that did not answer stats in time, labelers stuck in one model call: a runner or labeler is
        killed for Ray to restart it (recovered by `_watch` once its run() fails), or ends the run when its
        restarts are used up; the learner cannot be restarted, so it ends the run."""
        warmup_s = max(float(self.cfg.run.restart_timeout_s), self.deadline_s)
        for role, problem in self.supervisor.unresponsive(self.deadline_s, warmup_s):
            if role in self.supervisor.learners:
                raise RoleFailed(f"{_learner_name(role)} {problem}; resume from its last checkpoint: "
                                 f"rlfarm train resume={self.run.dir}")
            if self._recovering:
                self.supervisor.kill(role, problem)
            else:
                self._leave_behind(role, problem)
        self.learner_watch.look()

    def _leave_behind(self, worker: Worker, problem: str) -> None:
        """The run is ending: a dead or stuck worker is not restarted; what it held is counted as not labeled."""
        if worker.name not in self._left_behind:
            self._left_behind.add(worker.name)
            log.warning("%s %s while the run ends: not restarted", worker.name, problem)

    def _recover(self, worker: Worker, noticed: float) -> None:
        """A runner or labeler died (or was killed for being stuck): wait for Ray to restart it, then give it back
        what it lost: its peers, the policy, its share of the work (a runner) or the chunks it held (a labeler)."""
        if self._preempt:  # SIGTERM reached the whole job (Slurm): the run ends with a checkpoint, no restart
            raise RoleFailed(f"{worker.name} died after SIGTERM")
        try:
            pid = self.supervisor.wait_until_back(worker, float(self.cfg.run.restart_timeout_s), self._must_end)
        except Interrupted:
            if self._preempt:
                raise
            self._recovering = False  # out of time: the wind-down begins with the next look at the clock
            self._leave_behind(worker, "died")
            return
        detail = self.rewiring.rewire(worker, worker.incarnation + 1)
        self.supervisor.restarted(worker, pid, noticed, detail)

    # -- small helpers -------------------------------------------------------------------------------
    def _ask(self, ref: ray.ObjectRef, what: str, timeout_s: float | None = None, who: str = "the learner"):
        """One role's answer within the deadline (or `timeout_s`, if longer); SIGTERM cuts the wait short."""
        return self._ask_all([(who, ref)], what, timeout_s)[0]

    def _ask_all(self, calls: list[tuple[str, ray.ObjectRef]], what: str, timeout_s: float | None = None) -> list:
        """Named roles' answers within the deadline (or `timeout_s`, if longer); SIGTERM cuts the wait short."""
        return self.calls.ask(calls, what, max(timeout_s or 0.0, self.deadline_s), self._signalled)

    def _signalled(self) -> bool:
        return self._preempt

    def _must_end(self) -> bool:
        return self._preempt or self._out_of_time()

    def _out_of_time(self) -> bool:
        budget = self.cfg.run.max_wall_s
        return bool(budget) and self.progress.wall_s > budget

    def _wind_down_past(self, share: float) -> bool:
        """Out of time, and more than `share` of the wind-down has passed."""
        return self._end_by is not None and time.monotonic() > self._end_by - WIND_DOWN_S * (1 - share)

    def _check_signal(self) -> None:
        """Inside a stage that waits: SIGTERM ends it now (until_preempted then writes preempted.pt)."""
        if self._preempt:
            raise Interrupted("SIGTERM")

    def _runs(self, kind: str) -> list[ray.ObjectRef]:
        return [w.done for w in self.supervisor.of(kind)]

    def _produced(self) -> int:
        """Transitions the live runner incarnations produced this epoch: run()'s result where it returned, else the
        newest stats (a runner left behind at the wind-down)."""
        total = 0
        for worker in self.supervisor.of("env_runner"):
            try:
                total += self.calls.get(worker.done, timeout=0)["produced"]
            except ray.exceptions.RayError:  # still running (GetTimeoutError), or died
                total += worker.stats.get("produced", 0)
        return total

    # -- metrics --------------------------------------------------------------------------------------
    def _poll(self, wait_s: float) -> list[Worker]:
        """Fresh stats from the roles (returns the roles that answered); the runners' finished episodes go into the
        progress window."""
        fresh = self.supervisor.poll(wait_s)
        for role in fresh:
            self.progress.window.extend(role.stats.get("episode_returns", []))
            self.progress.add(episodes=len(role.stats.get("episode_returns", [])))
        return fresh

    def _record(self) -> dict:
        """One metrics row, logged: fresh stats (stage times of the roles that answered and are at work)."""
        row = self.metrics.row(self.supervisor.running(self._poll(POLL_WAIT_S)))
        self.run.log(row)
        return row


def _learner_name(rank: Worker) -> str:
    """"the learner" (rank 0), "learner rank 1", ...: how a line names a learner rank."""
    return "the learner" if rank.kind == "learner" else rank.name


def _one_line(error: Exception) -> str:
    """The innermost message of a Ray error, on one line."""
    cause = getattr(error, "cause", None) or error
    text = str(cause).strip().splitlines()
    last = next((line for line in reversed(text) if line.strip()), type(cause).__name__)
    return f"a role failed: {type(cause).__name__}: {last.strip()}"

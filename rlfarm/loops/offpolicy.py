"""Off-policy driver: act → label → learn run concurrently inside the roles; this loop only starts them,
watches their counters, logs, and stops them. Data never passes through here.

The driver never waits on a role without a deadline (`run.role_timeout_s`, rlfarm/loops/supervision.py): a runner
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

import numpy as np
import psutil
import ray
from omegaconf import DictConfig

from rlfarm.loops.checkpoints import PeriodicCheckpoints
from rlfarm.loops.progress import Progress
from rlfarm.loops.roles import OffPolicyRoles, start_offpolicy_roles
from rlfarm.loops.deadlines import SLICE_S, Interrupted, RoleFailed, RoleUnresponsive, ask, ask_one
from rlfarm.loops.supervision import Supervisor, Worker, first_seq
from rlfarm.run import Run, newest_checkpoint
from rlfarm.telemetry.live import LiveView
from rlfarm.telemetry.stages import KINDS, StageShares
from rlfarm.topology import PlacedTopology

log = logging.getLogger("rlfarm")

RETURN_WINDOW = 10       # episode_return_mean is over the last 10 finished episodes
POLL_WAIT_S = 2.0        # a metrics tick waits this long at most for the roles' stats, then uses the newest it has
WIND_DOWN_S = 15.0       # after run.max_wall_s: runners stop (first third), the tail is stored (second), owed updates
LAST_SAVE_S = 8.0        # ... and final.pt gets the rest, at least this: the run ends within ~30 s of its budget
PREEMPT_SAVE_S = 15.0    # SIGTERM → preempted.pt within this (Slurm kills the job ~30 s after its signal)
CHECKPOINT_IO_S = 120.0  # final.pt at a normal end, a resume's load: a big replay buffer takes a while to move
STALLED_FLUSHES = 2      # the tail's flush gives up after this many role_timeout_s without anything settled
# What a metrics row takes of the learner's own numbers: SAC's losses; an actor-learner's losses, V-trace's mean ρ
# and the policy lag of the chunks its batches took (weight versions), with what the lag bound dropped.
LEARNER_METRICS = ("critic_loss", "actor_loss", "alpha", "entropy", "policy_loss", "value_loss", "clip_fraction",
                   "rho_mean", "grad_norm", "policy_lag_mean", "policy_lag_max", "chunks_dropped_lag",
                   "transitions_dropped_lag", "learner_ranks")


class OffPolicyLoop(PeriodicCheckpoints):
    def __init__(self, cfg: DictConfig, run: Run, placed: PlacedTopology, resume_from: str | None = None):
        self.cfg, self.run = cfg, run
        self.deadline_s = float(cfg.run.role_timeout_s)
        self.checkpoint_late_s = self.deadline_s
        self.roles: OffPolicyRoles = start_offpolicy_roles(cfg, placed, str(run.dir / "quarantine"))
        self.supervisor = Supervisor(self.roles.learner, self.roles.runners, self.roles.labelers,
                                     int(cfg.run.max_restarts), run.dir / "roles.json")
        # epoch: how many times the run was resumed (it keys the runners' chunk seqs apart across resumes)
        self.progress = Progress(window=RETURN_WINDOW, episodes=0, epoch=0)
        # What the learner had settled before this epoch: the runners' and labelers' own counts start at zero.
        self.offset = {"env_steps": 0, "produced": 0, "labeled": 0}
        self.stages = StageShares()
        self.target = cfg.algo.get("target_return")  # the runners stop once the return window reaches it
        self._reached_target = False
        self._previous: dict | None = None
        self._end_by: float | None = None  # run.max_wall_s reached: when the wind-down must be over
        self._recovering = True            # dead or stuck workers are restarted (not while the run ends)
        self._left_behind: set[str] = set()  # workers not restarted because the run is ending (named once each)
        self._learner_seen: tuple[tuple, float] = ((), time.monotonic())  # (updates, stored), since when
        self._stall_warned = False
        self._first_step_at = float("inf")  # time.time() of the first env step any runner took (startup_s)
        self._start_checkpoints()
        if resume_from:
            self._resume(resume_from)

    # -- checkpoints ---------------------------------------------------------------------------------
    def _resume(self, path: str) -> None:
        """Continue from a checkpoint: the learner restores itself; counters continue from what it had stored."""
        learner = self.roles.learner
        self.progress.load_state_dict(self._ask(learner.load.remote(path), f"load {path}", CHECKPOINT_IO_S))
        self.progress.add(epoch=1)
        stats = self._ask(learner.stats.remote(), "stats")
        settled = _accounted(stats)
        self.offset = {"env_steps": settled, "produced": settled, "labeled": stats["stored"]}
        self.schedule_checkpoints_from(stats["updates"])
        self.run.truncate_metrics(after_step=settled)
        log.info("resumed from %s at %d env steps, %d updates", path, settled, stats["updates"])

    def checkpoint(self, name: str = "final.pt", with_buffer: bool | None = None) -> str | None:
        """Write `name` and return its path. final.pt that is not written within its deadline (PREEMPT_SAVE_S once
        SIGTERM arrives) is named and left out (None: the summary is still written); any other late save raises."""
        ref, what = self._save(name, with_buffer), f"save {name}"
        try:
            if name != "final.pt":
                return ask_one("the learner", ref, what, self._save_deadline_s(name))
            try:
                return ask_one("the learner", ref, what, self._save_deadline_s(name), self._signalled)
            except Interrupted:  # SIGTERM: the job ends soon; final.pt gets what preempted.pt would
                return ask_one("the learner", ref, what, PREEMPT_SAVE_S)
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
        return self.roles.learner.save.remote(str(self.run.checkpoint_dir / name), self.progress.state_dict(),
                                              with_buffer=with_buffer)

    def _save_deadline_s(self, name: str) -> float:
        if name == "preempted.pt":
            return PREEMPT_SAVE_S
        if self._end_by is not None:  # out of time: what is left of the wind-down
            return max(self._end_by - time.monotonic(), LAST_SAVE_S)
        return max(self.deadline_s, CHECKPOINT_IO_S)

    # -- the run -------------------------------------------------------------------------------------
    def train(self) -> dict:
        roles, total, sup = self.roles, int(self.cfg.total_env_steps), self.supervisor
        left = max(total - self.offset["env_steps"], 0)
        sup.start_epoch(self.progress["epoch"], [len(s) for s in np.array_split(np.arange(left), len(roles.runners))])
        sup.learner.done = roles.learner.run.remote()
        for worker in sup.of("labeler"):
            worker.done = worker.actor.run.remote()
        for worker in sup.of("env_runner"):
            worker.done = worker.actor.run.remote(sup.shares[worker.index], first_seq(sup.epoch, 0),
                                                  sup.runner_key(worker, 0))
        self._poll(wait_s=self.deadline_s)  # every role's pid, for roles.json
        if not sup.learner.stats:
            raise RoleUnresponsive(f"the learner did not answer stats within {self.deadline_s:g} s")
        sup.write_roles_file()
        title = f"rlfarm · {self.cfg.algo.name} · {self.cfg.env.id} · {self.cfg.topology.name}"
        view = LiveView(title, self.cfg.run.live, total_env_steps=total)  # its ETA: from the rate shown
        with self.until_preempted(with_buffer=True), view:
            while not self._finished():                                                   # 1. act/label/learn
                row = self._record()
                view.update(row)
                self._after_update(row["updates"], with_buffer=True)
            self._flush()                                                                 # 2. label + store the tail
            self._recovering = False
            for actor in [*roles.labelers, roles.learner]:
                actor.stop.remote()  # a flag each role reads; what they do next is awaited in _wait
            self._wait()                                                                  # 3. owed updates
            self._land_last_checkpoint(self._save_deadline_s("step"))
            row = self._record()
            view.update(row)
        return self._summary(row)                                                         # 4. summary

    # -- stages -------------------------------------------------------------------------------------
    def _finished(self) -> bool:
        """One tick: wait a metrics interval for the runners, watch the roles; True once the runners are done
        (or, out of time, once the wind-down's first third has passed for a runner that does not stop)."""
        ray.wait(self._runs("env_runner"), num_returns=len(self.roles.runners), timeout=self.cfg.run.metrics_interval_s)
        self._watch()
        self._check_clock()
        self._check_target()
        _, running = ray.wait(self._runs("env_runner"), num_returns=len(self.roles.runners), timeout=0)
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
            # After a resume the learner's counts include what it had settled before (self.offset), the runners'
            # count only this epoch: compare like with like, or the tail is dropped while still in flight.
            settled = _accounted(learner) - self.offset["produced"] - sup.settled_by_dead(learner)
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
        waiting = {sup.learner.done: "the learner", **{w.done: w.name for w in sup.of("labeler")}}
        updates, progress_at = None, time.monotonic()
        while True:
            self._check_signal()
            self._check_clock()
            _, pending = ray.wait(list(waiting), num_returns=len(waiting), timeout=SLICE_S)
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
        learner_done = self.supervisor.learner.done
        refs = [learner_done] + [w.done for w in self.supervisor.workers]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                if ref is learner_done:
                    raise RoleFailed("the learner died; resume from its last checkpoint: "
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
            if role.kind == "learner":
                raise RoleFailed(f"the learner {problem}; resume from its last checkpoint: "
                                 f"rlfarm train resume={self.run.dir}")
            if self._recovering:
                self.supervisor.kill(role, problem)
            else:
                self._leave_behind(role, problem)
        self._watch_learner_progress()

    def _watch_learner_progress(self) -> None:
        """A learner that answers but has stored and updated nothing for a deadline while work waits for it is
        named once (it may be compiling: it is waited for; SIGTERM and run.max_wall_s still end the run)."""
        stats, now = self.supervisor.learner.stats, time.monotonic()
        seen, since = self._learner_seen
        progress = (stats.get("updates"), stats.get("stored"))
        work = self._learner_work(stats)
        if progress != seen or not work:
            if self._stall_warned:
                log.info("the learner is making progress again after %.0f s", now - since)
            self._learner_seen, self._stall_warned = (progress, now), False
        elif now - since > self.deadline_s and not self._stall_warned:
            self._stall_warned = True
            log.warning("the learner (pid %s) has made no progress for %.0f s with %s (stalled, or compiling): "
                        "waiting for it; SIGTERM and run.max_wall_s still end the run",
                        self.supervisor.learner.pid, now - since, work)

    def _learner_work(self, stats: dict) -> str | None:
        """What waits for the learner: the updates it owes (when it reports them), else the runners' chunks not
        acked yet while no labeler holds any (they are in the learner's inbox or wait for its updates)."""
        if "owed" in stats:
            return f"{stats['owed']:,} updates owed" if stats["owed"] > 0 else None
        sup = self.supervisor
        unacked = sum(w.stats.get("in_flight", 0) for w in sup.of("env_runner"))
        at_labelers = any(w.stats.get("queued", 0) or w.stats.get("in_call_s", 0) for w in sup.of("labeler"))
        return f"{unacked} chunks not acked" if unacked and not at_labelers else None

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
        roles, sup = self.roles, self.supervisor
        try:
            pid = sup.wait_until_back(worker, float(self.cfg.run.restart_timeout_s), interrupted=self._must_end)
        except Interrupted:
            if self._preempt:
                raise
            self._recovering = False  # out of time: the wind-down begins with the next look at the clock
            self._leave_behind(worker, "died")
            return
        incarnation = worker.incarnation + 1
        if worker.kind == "labeler":
            self._ask(worker.actor.set_learner.remote(roles.learner_ranks, incarnation), "set_learner", who=worker.name)
            worker.done = worker.actor.run.remote()
            runners = sup.of("env_runner")
            resent = sum(ask([(r.name, r.actor.redispatch.remote(worker.index)) for r in runners], "redispatch",
                             self.deadline_s, self._signalled))
            detail = {"chunks_resent": resent}
        else:
            sup.runner_lost(worker)
            learner = self._ask(roles.learner.stats.remote(), "stats")
            remaining = sup.successor_budget(worker.index, learner)
            learning = learner["updates"] > 0
            self._ask(worker.actor.set_labelers.remote(roles.labelers), "set_labelers", who=worker.name)
            roles.learner.push_weights.remote()
            worker.done = worker.actor.run.remote(remaining, first_seq(sup.epoch, incarnation),
                                                  sup.runner_key(worker, incarnation), 0 if learning else None)
            detail = {"env_steps_left": remaining}
        sup.restarted(worker, pid, noticed, detail)

    # -- small helpers -------------------------------------------------------------------------------
    def _ask(self, ref: ray.ObjectRef, what: str, timeout_s: float | None = None, who: str = "the learner"):
        """One role's answer within the deadline (or `timeout_s`); SIGTERM cuts the wait short."""
        return ask_one(who, ref, what, max(timeout_s or 0.0, self.deadline_s), self._signalled)

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
                total += ray.get(worker.done, timeout=0)["produced"]
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
        row = self._observe()
        self.run.log(row)
        return row

    def _observe(self) -> dict:
        """Poll every role's counters and turn them into one metrics row (rates over the last interval).
        Counters add up the live workers' own counts and, from the learner, what dead incarnations delivered."""
        sup = self.supervisor
        fresh = sup.running(self._poll(POLL_WAIT_S))  # stage times: of the roles that answered and are at work
        learner = sup.learner.stats
        runners = [w.stats for w in sup.of("env_runner")]
        self._first_step_at = min([self._first_step_at, *(s["first_step_at"] for s in runners if s.get("first_step_at"))])
        labelers = [w.stats for w in sup.of("labeler")]
        live = lambda stats, key: sum(s.get(key, 0) for s in stats)  # noqa: E731 - a restarting worker has {}
        now, session_s = time.monotonic(), self.progress.session_s
        off = self.offset
        sup.tighten_budgets(learner)
        dead_runners, dead_labelers = sup.settled_by_dead(learner), sup.delivered_by_dead(learner)
        counters = {"env_steps": off["env_steps"] + live(runners, "env_steps") + sup.dead_env_steps(learner),
                    "produced": off["produced"] + live(runners, "produced") + dead_runners,
                    "labeled": off["labeled"] + live(labelers, "labeled") + dead_labelers - learner["duplicate_transitions"],
                    "stored": learner["stored"], "updates": learner["updates"], "t": now}
        start = {**counters, **off, "t": now - session_s}  # this epoch's start
        prev, self._previous = self._previous or start, counters
        dt = max(now - prev["t"], 1e-9)
        rate = lambda key: max(counters[key] - prev[key], 0) / dt  # noqa: E731
        total = int(self.cfg.total_env_steps)
        lags = [l["labeling_lag_s"] for l in labelers if l.get("labeling_lag_s", 0) > 0]
        losses = {k: learner[k] for k in LEARNER_METRICS if k in learner}
        # per stored transition over the interval: the reward trained on beside the env's own (a learned reward's gap)
        rewards = {k: learner.get(k) for k in ("labeled_reward_mean", "env_reward_mean", "reward_gap_mean")}
        return {
            "env_steps": counters["env_steps"], "wall_s": round(self.progress.wall_s, 3),
            "env_steps_per_s": rate("env_steps"), "labeled_per_s": rate("labeled"), "updates_per_s": rate("updates"),
            "labeling_lag_s": float(np.mean(lags)) if lags else None,
            "labeled_fraction": counters["labeled"] / max(counters["produced"], 1),
            "transitions_produced": counters["produced"], "transitions_labeled": counters["labeled"],
            "transitions_stored": counters["stored"], "updates": counters["updates"],
            "transitions_relabeled": learner["duplicate_transitions"],
            "buffer_size": learner["buffer_size"], "policy_version": learner["policy_version"],
            "policy_staleness": learner["policy_staleness"], "duplicates": learner["duplicates"],
            "transitions_quarantined": learner["quarantined"],
            "reward_retries": live(labelers, "retries"),
            "reward_last_error": next((l["last_error"] for l in labelers if l.get("last_error")), None),
            "reward_call_s": max((l.get("in_call_s", 0.0) for l in labelers), default=0.0),  # the longest call now
            "worker_restarts": len(sup.recoveries),
            "episodes": self.progress["episodes"],
            "episode_return_mean": self.progress.window_mean(),
            "eta_s": (total - counters["env_steps"]) / max(counters["env_steps"] - off["env_steps"], 1) * session_s,
            **rewards, **losses,
            **self.stages.row({kind: [w.stats for w in fresh if w.kind == kind] for kind in KINDS},
                              late=self._late_kinds(fresh)),
        }

    def _late_kinds(self, fresh: list[Worker]) -> tuple[str, ...]:
        """Kinds of role at work none of which answered this tick's stats request in time."""
        at_work = self.supervisor.running([self.supervisor.learner, *self.supervisor.workers])
        answered = {w.kind for w in fresh}
        return tuple(kind for kind in KINDS if kind not in answered and any(w.kind == kind for w in at_work))

    def _summary(self, row: dict) -> dict:
        keys = ("env_steps", "transitions_produced", "transitions_labeled", "transitions_stored",
                "transitions_quarantined", "transitions_relabeled", "reward_retries", "reward_last_error", "updates",
                "episodes", "episode_return_mean", "duplicates", "policy_version", "worker_restarts")
        unlabeled = row["transitions_produced"] - row["transitions_labeled"] - row["transitions_quarantined"]
        target = {} if self.target is None else {"target_return": self.target, "reached_target": self._reached_target}
        dropped = {k: row[k] for k in ("transitions_dropped_lag", "learner_ranks") if k in row}
        return {k: row[k] for k in keys} | target | dropped | {"transitions_unlabeled": max(unlabeled, 0),
                                             "wall_s": round(self.progress.wall_s, 2), "restarts": self.progress["epoch"],
                                             "startup_s": startup_s(self._first_step_at),
                                             "recoveries": self.supervisor.recoveries}


def startup_s(first_step_at: float) -> float | None:
    """Seconds from this process's start (the command typed) to the first env step of any runner."""
    if first_step_at == float("inf"):
        return None
    return round(first_step_at - psutil.Process().create_time(), 2)


def _accounted(learner_stats: dict) -> int:
    """Transitions the learner has settled: stored, or reported quarantined by a labeler."""
    return learner_stats["stored"] + learner_stats["quarantined"]


def _one_line(error: Exception) -> str:
    """The innermost message of a Ray error, on one line."""
    cause = getattr(error, "cause", None) or error
    text = str(cause).strip().splitlines()
    last = next((line for line in reversed(text) if line.strip()), type(cause).__name__)
    return f"a role failed: {type(cause).__name__}: {last.strip()}"

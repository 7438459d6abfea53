"""Off-policy driver: act → label → learn run concurrently inside the roles; this loop only starts them,
watches their counters, logs, and stops them. Data never passes through here."""
from __future__ import annotations

import logging
import time

import numpy as np
import ray
from omegaconf import DictConfig

from rlfarm.loops.checkpoints import PeriodicCheckpoints
from rlfarm.loops.progress import Progress
from rlfarm.loops.roles import OffPolicyRoles, start_offpolicy_roles
from rlfarm.loops.supervision import Supervisor, Worker, WorkerLost, first_seq
from rlfarm.run import Run
from rlfarm.telemetry.live import LiveView
from rlfarm.topology import PlacedTopology

log = logging.getLogger("rlfarm")

RETURN_WINDOW = 10  # episode_return_mean is over the last 10 finished episodes
FLUSH_TIMEOUT_S = 120.0


class RoleFailed(RuntimeError):
    pass


class OffPolicyLoop(PeriodicCheckpoints):
    def __init__(self, cfg: DictConfig, run: Run, placed: PlacedTopology, resume_from: str | None = None):
        self.cfg, self.run = cfg, run
        self.roles: OffPolicyRoles = start_offpolicy_roles(cfg, placed, str(run.dir / "quarantine"))
        self.supervisor = Supervisor(self.roles.runners, self.roles.labelers, int(cfg.run.max_restarts),
                                     run.dir / "roles.json")
        # epoch: how many times the run was resumed (it keys the runners' chunk seqs apart across resumes)
        self.progress = Progress(window=RETURN_WINDOW, episodes=0, epoch=0)
        # What the learner had settled before this epoch: the runners' and labelers' own counts start at zero.
        self.offset = {"env_steps": 0, "produced": 0, "labeled": 0}
        self._previous: dict | None = None
        self._out_of_time = False
        self._start_checkpoints()
        if resume_from:
            self._resume(resume_from)

    # -- checkpoints ---------------------------------------------------------------------------------
    def _resume(self, path: str) -> None:
        """Continue from a checkpoint: the learner restores itself; counters continue from what it had stored."""
        self.progress.load_state_dict(ray.get(self.roles.learner.load.remote(path)))
        self.progress.add(epoch=1)
        learner = ray.get(self.roles.learner.stats.remote())
        settled = _accounted(learner)
        self.offset = {"env_steps": settled, "produced": settled, "labeled": learner["stored"]}
        self.schedule_checkpoints_from(learner["updates"])
        self.run.truncate_metrics(after_step=settled)
        log.info("resumed from %s at %d env steps, %d updates", path, settled, learner["updates"])

    def checkpoint(self, name: str = "final.pt", with_buffer: bool | None = None) -> str:
        if with_buffer is None:
            with_buffer = bool(self.cfg.run.checkpoint_buffer)
        return ray.get(self.roles.learner.save.remote(str(self.run.checkpoint_dir / name), with_buffer,
                                                      self.progress.state_dict()))

    def train(self) -> dict:
        roles, total, sup = self.roles, int(self.cfg.total_env_steps), self.supervisor
        left = max(total - self.offset["env_steps"], 0)
        sup.start_epoch(self.progress["epoch"], [len(s) for s in np.array_split(np.arange(left), len(roles.runners))])
        learner_done = roles.learner.run.remote()
        for worker in sup.of("labeler"):
            worker.done = worker.actor.run.remote()
        for worker in sup.of("env_runner"):
            worker.done = worker.actor.run.remote(sup.shares[worker.index], first_seq(sup.epoch, 0),
                                                  sup.runner_key(worker, 0))
        sup.poll(timeout_s=30)
        sup.write_roles_file()
        title = f"rlfarm · {self.cfg.algo.name} · {self.cfg.env.id} · {self.cfg.topology.name}"
        with self.until_preempted(with_buffer=True), LiveView(title, self.cfg.run.live) as view:
            while not self._finished(learner_done):                                      # 1. act/label/learn
                row = self._record()
                view.update(row)
                self._after_update(row["updates"], with_buffer=True)
            self._flush(learner_done)                                                     # 2. label + store the tail
            ray.get([l.stop.remote() for l in roles.labelers] + [roles.learner.stop.remote()])
            self._wait(learner_done)                                                      # 3. owed updates
            row = self._record()
            view.update(row)
        return self._summary(row)                                                          # 4. summary

    # -- stages -------------------------------------------------------------------------------------
    def _finished(self, learner_done) -> bool:
        runners = self.supervisor.of("env_runner")
        ray.wait([w.done for w in runners], num_returns=len(runners), timeout=self.cfg.run.metrics_interval_s)
        self._watch(learner_done)
        budget = self.cfg.run.max_wall_s
        if budget and self.progress.wall_s > budget and not self._out_of_time:
            # Time budget spent: runners stop after their current chunk; the tail is still labeled and stored.
            log.info("run.max_wall_s=%s reached: stopping the env runners", budget)
            self._out_of_time = True
            ray.get([r.stop.remote() for r in self.roles.runners])
        ready, _ = ray.wait([w.done for w in runners], num_returns=len(runners), timeout=0)
        return len(ready) == len(runners)

    def _watch(self, learner_done) -> None:
        """Restart-and-rewire dead workers; fail the run on any other error (or a death past max_restarts)."""
        noticed = time.monotonic()  # recovery time counts from here for every worker found dead now
        for worker in self.supervisor.dead():
            self._recover(worker, noticed)
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

    def _recover(self, worker: Worker, noticed: float) -> None:
        """A runner or labeler died: wait for Ray to restart it, then give it back what it lost: its peers,
        the policy, its share of the work (a runner) or the chunks it held (a labeler)."""
        if self._preempt:  # SIGTERM reached the whole job (Slurm): the run ends with a checkpoint, no restart
            raise RoleFailed(f"{worker.name} died after SIGTERM")
        roles, sup = self.roles, self.supervisor
        try:
            pid = sup.wait_until_back(worker, float(self.cfg.run.restart_timeout_s))
        except WorkerLost as lost:
            raise RoleFailed(str(lost)) from None
        incarnation = worker.incarnation + 1
        if worker.kind == "labeler":
            ray.get(worker.actor.set_learner.remote(roles.learner, incarnation))
            worker.done = worker.actor.run.remote()
            resent = sum(ray.get([r.redispatch.remote(worker.index) for r in roles.runners]))
            detail = {"chunks_resent": resent}
        else:
            sup.runner_lost(worker)
            learner = ray.get(roles.learner.stats.remote())
            remaining = sup.successor_budget(worker.index, learner)
            learning = learner["updates"] > 0
            ray.get(worker.actor.set_labelers.remote(roles.labelers))
            roles.learner.push_weights.remote()
            worker.done = worker.actor.run.remote(remaining, first_seq(sup.epoch, incarnation),
                                                  sup.runner_key(worker, incarnation), 0 if learning else None)
            detail = {"env_steps_left": remaining}
        sup.restarted(worker, pid, noticed, detail)

    def _flush(self, learner_done) -> None:
        """Wait until every transition the runners produced is stored (or quarantined) by the learner."""
        deadline = time.monotonic() + FLUSH_TIMEOUT_S
        while True:
            self._watch(learner_done)
            produced = sum(ray.get(w.done)["produced"] for w in self.supervisor.of("env_runner"))
            learner = ray.get(self.roles.learner.stats.remote())
            # After a resume the learner's counts include what it had settled before (self.offset), the runners'
            # count only this epoch: compare like with like, or the tail is dropped while still in flight.
            if _accounted(learner) - self.offset["produced"] - self.supervisor.settled_by_dead(learner) >= produced:
                return
            if time.monotonic() > deadline:
                raise RoleFailed(f"labeled chunks did not all reach the learner within {FLUSH_TIMEOUT_S:g} s")
            time.sleep(0.05)

    def _wait(self, learner_done) -> None:
        refs = [learner_done, *(w.done for w in self.supervisor.of("labeler"))]
        ray.wait(refs, num_returns=len(refs), timeout=FLUSH_TIMEOUT_S)
        self._watch(learner_done)

    def _record(self) -> dict:
        row = self._observe()
        self.run.log(row)
        return row

    def _observe(self) -> dict:
        """Poll every role's counters and turn them into one metrics row (rates over the last interval).
        Counters add up the live workers' own counts and, from the learner, what dead incarnations delivered."""
        sup = self.supervisor
        learner = ray.get(self.roles.learner.stats.remote())
        for stats in sup.poll():
            self.progress.window.extend(stats.get("episode_returns", []))
            self.progress.add(episodes=len(stats.get("episode_returns", [])))
        runners = [w.stats for w in sup.of("env_runner")]
        labelers = [w.stats for w in sup.of("labeler")]
        live = lambda stats, key: sum(s.get(key, 0) for s in stats)  # noqa: E731 - a restarting worker has {}
        now, session_s = time.monotonic(), self.progress.session_s
        off = self.offset
        sup.tighten_budgets(learner)
        dead_runners, dead_labelers = sup.settled_by_dead(learner), sup.delivered_by_dead(learner)
        counters = {"env_steps": off["env_steps"] + live(runners, "env_steps") + sup.dead_env_steps(learner),
                    "produced": off["produced"] + live(runners, "produced") + dead_runners,
                    "labeled": off["labeled"] + live(labelers, "labeled") + dead_labelers - learner["duplicate_transitions"],
                    "stored": learner["stored"], "updates": learner["updates"],
                    "labeler_busy_s": live(labelers, "busy_s"), "t": now}
        start = {**counters, **off, "labeler_busy_s": 0.0, "t": now - session_s}  # this epoch's start
        prev, self._previous = self._previous or start, counters
        dt = max(now - prev["t"], 1e-9)
        rate = lambda key: max(counters[key] - prev[key], 0) / dt  # noqa: E731 - a restart resets busy_s
        total = int(self.cfg.total_env_steps)
        lags = [l["labeling_lag_s"] for l in labelers if l.get("labeling_lag_s", 0) > 0]
        losses = {k: learner[k] for k in ("critic_loss", "actor_loss", "alpha", "entropy") if k in learner}
        return {
            "env_steps": counters["env_steps"], "wall_s": round(self.progress.wall_s, 3),
            "env_steps_per_s": rate("env_steps"), "labeled_per_s": rate("labeled"), "updates_per_s": rate("updates"),
            "labeling_lag_s": float(np.mean(lags)) if lags else None,
            "labeled_fraction": counters["labeled"] / max(counters["produced"], 1),
            "labeler_busy_fraction": rate("labeler_busy_s") / max(len(labelers), 1),
            "transitions_produced": counters["produced"], "transitions_labeled": counters["labeled"],
            "transitions_stored": counters["stored"], "updates": counters["updates"],
            "transitions_relabeled": learner["duplicate_transitions"],
            "buffer_size": learner["buffer_size"], "policy_version": learner["policy_version"],
            "policy_staleness": learner["policy_staleness"], "duplicates": learner["duplicates"],
            "transitions_quarantined": learner["quarantined"],
            "reward_retries": live(labelers, "retries"),
            "reward_last_error": next((l["last_error"] for l in labelers if l.get("last_error")), None),
            "worker_restarts": len(sup.recoveries),
            "episodes": self.progress["episodes"],
            "episode_return_mean": self.progress.window_mean(),
            "eta_s": (total - counters["env_steps"]) / max(counters["env_steps"] - off["env_steps"], 1) * session_s,
            **losses,
        }

    def _summary(self, row: dict) -> dict:
        keys = ("env_steps", "transitions_produced", "transitions_labeled", "transitions_stored",
                "transitions_quarantined", "transitions_relabeled", "reward_retries", "reward_last_error", "updates",
                "episodes", "episode_return_mean", "duplicates", "policy_version", "worker_restarts")
        return {k: row[k] for k in keys} | {"wall_s": round(self.progress.wall_s, 2), "restarts": self.progress["epoch"],
                                             "recoveries": self.supervisor.recoveries}


def _accounted(learner_stats: dict) -> int:
    """Transitions the learner has settled: stored, or reported quarantined by a labeler."""
    return learner_stats["stored"] + learner_stats["quarantined"]


def _one_line(error: Exception) -> str:
    """The innermost message of a Ray error, on one line."""
    cause = getattr(error, "cause", None) or error
    text = str(cause).strip().splitlines()
    last = next((line for line in reversed(text) if line.strip()), type(cause).__name__)
    return f"a role failed: {type(cause).__name__}: {last.strip()}"

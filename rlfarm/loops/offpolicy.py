"""Off-policy driver: act → label → learn run concurrently inside the roles; this loop only starts them,
watches their counters, logs, and stops them. Data never passes through here."""
from __future__ import annotations

import logging
import time
from collections import deque

import numpy as np
import ray
from omegaconf import DictConfig

from rlfarm.loops.checkpoints import PeriodicCheckpoints
from rlfarm.loops.roles import OffPolicyRoles, start_offpolicy_roles
from rlfarm.loops.supervision import Supervisor, Worker, WorkerLost, first_seq, incarnation_key
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
        # (runner index, incarnation key) of each dead runner incarnation → the env steps it last reported.
        self._reported_by_dead: dict[tuple[int, int], int] = {}
        self._budgets: dict[int, int] = {}
        self.returns: deque[float] = deque(maxlen=RETURN_WINDOW)
        self.episodes = 0
        self.epoch = 0
        self.offset = {"env_steps": 0, "produced": 0, "labeled": 0, "wall_s": 0.0}
        self.started = time.monotonic()
        self._previous: dict | None = None
        self._out_of_time = False
        self._start_checkpoints()
        if resume_from:
            self._resume(resume_from)

    # -- checkpoints ---------------------------------------------------------------------------------
    def _resume(self, path: str) -> None:
        """Continue from a checkpoint: the learner restores itself; counters continue from what it had stored."""
        extra = ray.get(self.roles.learner.load.remote(path))
        learner = ray.get(self.roles.learner.stats.remote())
        settled = learner["stored"] + learner["quarantined"]
        self.offset = {"env_steps": settled, "produced": settled, "labeled": learner["stored"],
                       "wall_s": float(extra.get("wall_s", 0.0))}
        self.episodes = int(extra.get("episodes", 0))
        self.returns.extend(extra.get("returns", []))
        self.epoch = int(extra.get("epoch", 0)) + 1
        self._last_checkpoint = (learner["updates"], time.monotonic())
        self.run.truncate_metrics(after_step=settled)
        log.info("resumed from %s at %d env steps, %d updates", path, settled, learner["updates"])

    def checkpoint(self, name: str = "final.pt", with_buffer: bool | None = None) -> str:
        if with_buffer is None:
            with_buffer = bool(self.cfg.run.checkpoint_buffer)
        extra = {"epoch": self.epoch, "episodes": self.episodes, "returns": list(self.returns),
                 "wall_s": self.offset["wall_s"] + time.monotonic() - self.started}
        return ray.get(self.roles.learner.save.remote(str(self.run.checkpoint_dir / name), with_buffer, extra))

    def train(self) -> dict:
        roles, total, sup = self.roles, int(self.cfg.total_env_steps), self.supervisor
        self.shares = [len(s) for s in np.array_split(np.arange(max(total - self.offset["env_steps"], 0)), len(roles.runners))]
        learner_done = roles.learner.run.remote()
        for worker in sup.of("labeler"):
            worker.done = worker.actor.run.remote()
        for worker in sup.of("env_runner"):
            worker.done = worker.actor.run.remote(self.shares[worker.index], first_seq(self.epoch, 0),
                                                  incarnation_key(self.epoch, 0))
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
        if budget and time.monotonic() - self.started > budget and not self._out_of_time:
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
        roles = self.roles
        try:
            pid = self.supervisor.wait_until_back(worker, float(self.cfg.run.restart_timeout_s))
        except WorkerLost as lost:
            raise RoleFailed(str(lost)) from None
        incarnation = worker.incarnation + 1
        if worker.kind == "labeler":
            ray.get(worker.actor.set_learner.remote(roles.learner, incarnation))
            worker.done = worker.actor.run.remote()
            resent = sum(ray.get([r.redispatch.remote(worker.index) for r in roles.runners]))
            detail = {"chunks_resent": resent}
        else:
            self._reported_by_dead[(worker.index, incarnation_key(self.epoch, worker.incarnation))] = \
                int(worker.stats.get("env_steps", 0))
            learner = ray.get(roles.learner.stats.remote())
            remaining = self._budgets[worker.index] = self._runner_budget(worker.index, learner)
            learning = learner["updates"] > 0
            ray.get(worker.actor.set_labelers.remote(roles.labelers))
            roles.learner.push_weights.remote()
            worker.done = worker.actor.run.remote(remaining, first_seq(self.epoch, incarnation),
                                                  incarnation_key(self.epoch, incarnation), 0 if learning else None)
            detail = {"env_steps_left": remaining}
        self.supervisor.restarted(worker, pid, noticed, detail)

    def _flush(self, learner_done) -> None:
        """Wait until every transition the runners produced is stored (or quarantined) by the learner."""
        deadline = time.monotonic() + FLUSH_TIMEOUT_S
        while True:
            self._watch(learner_done)
            produced = sum(ray.get(w.done)["produced"] for w in self.supervisor.of("env_runner"))
            learner = ray.get(self.roles.learner.stats.remote())
            # After a resume the learner's counts include what it had settled before (self.offset), the runners'
            # count only this epoch: compare like with like, or the tail is dropped while still in flight.
            if _accounted(learner) - self.offset["produced"] - self._settled_by_dead(learner) >= produced:
                return
            if time.monotonic() > deadline:
                raise RoleFailed(f"labeled chunks did not all reach the learner within {FLUSH_TIMEOUT_S:g} s")
            time.sleep(0.05)

    def _wait(self, learner_done) -> None:
        refs = [learner_done, *(w.done for w in self.supervisor.of("labeler"))]
        ray.wait(refs, num_returns=len(refs), timeout=FLUSH_TIMEOUT_S)
        self._watch(learner_done)

    def _dead_runner_steps(self, index: int, learner: dict) -> int:
        """Env steps the dead incarnations of runner `index` took: what they last reported, or more if more of
        their chunks reached the learner since (the report is up to one metrics interval old)."""
        settled = learner["settled_by_runner"]
        return sum(max(reported, settled.get(key, 0)) for key, reported in self._reported_by_dead.items()
                   if key[0] == index)

    def _runner_budget(self, index: int, learner: dict) -> int:
        return max(self.shares[index] - self._dead_runner_steps(index, learner), 0)

    def _tighten_budgets(self, learner: dict) -> None:
        """A dead runner's last chunks can reach the learner after its successor started: lower the
        successor's step budget by them, so the run never takes more than total_env_steps."""
        for worker in self.supervisor.of("env_runner"):
            if worker.index in self._budgets:
                budget = self._runner_budget(worker.index, learner)
                if budget < self._budgets[worker.index]:
                    self._budgets[worker.index] = budget
                    worker.actor.set_budget.remote(budget)

    def _settled_by_dead(self, learner: dict) -> int:
        """Transitions stored or quarantined that dead runner incarnations produced (this epoch)."""
        live = {(w.index, incarnation_key(self.epoch, w.incarnation)) for w in self.supervisor.of("env_runner")}
        return sum(n for key, n in learner["settled_by_runner"].items() if key not in live)

    def _delivered_by_dead(self, learner: dict) -> int:
        live = {(w.index, w.incarnation) for w in self.supervisor.of("labeler")}
        return sum(n for key, n in learner["delivered_by_labeler"].items() if key not in live)

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
            self.returns.extend(stats.get("episode_returns", []))
            self.episodes += len(stats.get("episode_returns", []))
        runners = [w.stats for w in sup.of("env_runner")]
        labelers = [w.stats for w in sup.of("labeler")]
        live = lambda stats, key: sum(s.get(key, 0) for s in stats)  # noqa: E731 - a restarting worker has {}
        now = time.monotonic()
        off = self.offset
        self._tighten_budgets(learner)
        dead_runners, dead_labelers = self._settled_by_dead(learner), self._delivered_by_dead(learner)
        dead_steps = sum(self._dead_runner_steps(i, learner) for i in {i for i, _ in self._reported_by_dead})
        counters = {"env_steps": off["env_steps"] + live(runners, "env_steps") + dead_steps,
                    "produced": off["produced"] + live(runners, "produced") + dead_runners,
                    "labeled": off["labeled"] + live(labelers, "labeled") + dead_labelers - learner["duplicate_transitions"],
                    "stored": learner["stored"], "updates": learner["updates"],
                    "labeler_busy_s": live(labelers, "busy_s"), "t": now}
        prev, self._previous = self._previous or {**counters, **off, "labeler_busy_s": 0.0, "t": self.started}, counters
        dt = max(now - prev["t"], 1e-9)
        rate = lambda key: max(counters[key] - prev[key], 0) / dt  # noqa: E731 - a restart resets busy_s
        elapsed = now - self.started + off["wall_s"]
        total = int(self.cfg.total_env_steps)
        lags = [l["labeling_lag_s"] for l in labelers if l.get("labeling_lag_s", 0) > 0]
        losses = {k: learner[k] for k in ("critic_loss", "actor_loss", "alpha", "entropy") if k in learner}
        return {
            "env_steps": counters["env_steps"], "wall_s": round(elapsed, 3),
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
            "episodes": self.episodes,
            "episode_return_mean": float(np.mean(self.returns)) if self.returns else None,
            "eta_s": (total - counters["env_steps"]) / max(counters["env_steps"] - off["env_steps"], 1) * (now - self.started),
            **losses,
        }

    def _summary(self, row: dict) -> dict:
        keys = ("env_steps", "transitions_produced", "transitions_labeled", "transitions_stored",
                "transitions_quarantined", "transitions_relabeled", "reward_retries", "reward_last_error", "updates",
                "episodes", "episode_return_mean", "duplicates", "policy_version", "worker_restarts")
        return {k: row[k] for k in keys} | {"wall_s": round(self.offset["wall_s"] + time.monotonic() - self.started, 2),
                                             "restarts": self.epoch, "recoveries": self.supervisor.recoveries}


def _accounted(learner_stats: dict) -> int:
    """Transitions the learner has settled: stored, or reported quarantined by a labeler."""
    return learner_stats["stored"] + learner_stats["quarantined"]


def _one_line(error: Exception) -> str:
    """The innermost message of a Ray error, on one line."""
    cause = getattr(error, "cause", None) or error
    text = str(cause).strip().splitlines()
    last = next((line for line in reversed(text) if line.strip()), type(cause).__name__)
    return f"a role failed: {type(cause).__name__}: {last.strip()}"

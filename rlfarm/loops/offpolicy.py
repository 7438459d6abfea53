"""Off-policy driver: act → label → learn run concurrently inside the roles; this loop only starts them,
watches their counters, logs, and stops them. Data never passes through here."""
from __future__ import annotations

import logging
import time
from collections import deque

import numpy as np
import ray
from omegaconf import DictConfig

from rlfarm.errors import Preempted
from rlfarm.loops.roles import OffPolicyRoles, start_offpolicy_roles
from rlfarm.run import Run
from rlfarm.telemetry.live import LiveView
from rlfarm.topology import PlacedTopology

log = logging.getLogger("rlfarm")

RETURN_WINDOW = 10  # episode_return_mean is over the last 10 finished episodes
FLUSH_TIMEOUT_S = 120.0


SEQS_PER_EPOCH = 10**9  # chunk seq numbers of the k-th (re)start begin at k·10⁹: ids never collide


class RoleFailed(RuntimeError):
    pass




class OffPolicyLoop:
    def __init__(self, cfg: DictConfig, run: Run, placed: PlacedTopology, resume_from: str | None = None):
        self.cfg, self.run = cfg, run
        self.roles: OffPolicyRoles = start_offpolicy_roles(cfg, placed, str(run.dir / "quarantine"))
        self.returns: deque[float] = deque(maxlen=RETURN_WINDOW)
        self.episodes = 0
        self.epoch = 0
        self.offset = {"env_steps": 0, "produced": 0, "labeled": 0, "wall_s": 0.0}
        self.started = time.monotonic()
        self._previous: dict | None = None
        self._out_of_time = False
        self._preempt = False
        self._last_checkpoint = (0, time.monotonic())  # (updates, time)
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
        self.run.truncate_metrics(after_env_steps=settled)
        log.info("resumed from %s at %d env steps, %d updates", path, settled, learner["updates"])

    def checkpoint(self, name: str = "final.pt", with_buffer: bool | None = None) -> str:
        if with_buffer is None:
            with_buffer = bool(self.cfg.run.checkpoint_buffer)
        extra = {"epoch": self.epoch, "episodes": self.episodes, "returns": list(self.returns),
                 "wall_s": self.offset["wall_s"] + time.monotonic() - self.started}
        return ray.get(self.roles.learner.save.remote(str(self.run.checkpoint_dir / name), with_buffer, extra))

    def request_preemption(self) -> None:
        """Signal-handler side: only sets a flag; the loop checkpoints on its next tick."""
        self._preempt = True

    def _maybe_checkpoint(self, updates: int) -> None:
        every_updates, every_min = self.cfg.run.checkpoint_every_updates, self.cfg.run.checkpoint_every_min
        last_updates, last_time = self._last_checkpoint
        due = (every_updates and updates - last_updates >= every_updates) or \
              (every_min and time.monotonic() - last_time >= 60 * every_min)
        if due:
            path = self.checkpoint(f"step_{updates:09d}.pt")
            self._last_checkpoint = (updates, time.monotonic())
            for old in sorted(self.run.checkpoint_dir.glob("step_*.pt"))[:-2]:  # keep the newest two
                old.unlink(missing_ok=True)
            log.info("checkpoint %s", path)

    def train(self) -> dict:
        roles, total = self.roles, int(self.cfg.total_env_steps)
        shares = np.array_split(np.arange(max(total - self.offset["env_steps"], 0)), len(roles.runners))
        learner_done = roles.learner.run.remote()
        labelers_done = [l.run.remote() for l in roles.labelers]
        runners_done = [r.run.remote(len(share), self.epoch * SEQS_PER_EPOCH) for r, share in zip(roles.runners, shares)]
        with LiveView(f"rlfarm · {self.cfg.algo.name} · {self.cfg.env.id} · {self.cfg.topology.name}",
                      self.cfg.run.live) as view:
            while not self._finished(runners_done, [learner_done, *labelers_done]):   # 1. act/label/learn
                row = self._record()
                view.update(row)
                self._maybe_checkpoint(row["updates"])
                if self._preempt:
                    raise Preempted(self.checkpoint("preempted.pt", with_buffer=True))
            produced = sum(r["produced"] for r in ray.get(runners_done))
            self._flush(produced, [learner_done, *labelers_done])                        # 2. label + store the tail
            ray.get([l.stop.remote() for l in roles.labelers] + [roles.learner.stop.remote()])
            self._wait(learner_done, labelers_done)                                       # 3. owed updates
            row = self._record()
            view.update(row)
        return self._summary(row)                                                          # 4. summary

    # -- stages -------------------------------------------------------------------------------------
    def _finished(self, runners_done: list, watched: list) -> bool:
        ready, _ = ray.wait(runners_done, num_returns=len(runners_done), timeout=self.cfg.run.metrics_interval_s)
        self._raise_if_failed(watched + ready)
        budget = self.cfg.run.max_wall_s
        if budget and time.monotonic() - self.started > budget and not self._out_of_time:
            # Time budget spent: runners stop after their current chunk; the tail is still labeled and stored.
            log.info("run.max_wall_s=%s reached: stopping the env runners", budget)
            self._out_of_time = True
            ray.get([r.stop.remote() for r in self.roles.runners])
        return len(ready) == len(runners_done)

    def _flush(self, produced: int, watched: list) -> None:
        deadline = time.monotonic() + FLUSH_TIMEOUT_S
        while _accounted(ray.get(self.roles.learner.stats.remote())) < produced:
            if time.monotonic() > deadline:
                raise RoleFailed(f"labeled chunks did not all reach the learner within {FLUSH_TIMEOUT_S:g} s")
            self._raise_if_failed(watched)
            time.sleep(0.05)

    def _wait(self, learner_done, labelers_done) -> None:
        ready, _ = ray.wait([learner_done, *labelers_done], num_returns=1 + len(labelers_done), timeout=FLUSH_TIMEOUT_S)
        self._raise_if_failed(ready)

    def _raise_if_failed(self, refs: list) -> None:
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            try:
                ray.get(ref)
            except ray.exceptions.RayError as error:
                raise RoleFailed(_one_line(error)) from None

    def _record(self) -> dict:
        row = self._observe()
        self.run.log(row)
        return row

    def _observe(self) -> dict:
        """Poll every role's counters and turn them into one metrics row (rates over the last interval)."""
        roles = self.roles
        learner, *rest = ray.get([a.stats.remote() for a in roles.all])
        runners, labelers = rest[: len(roles.runners)], rest[len(roles.runners):]
        for r in runners:
            self.returns.extend(r["episode_returns"])
            self.episodes += len(r["episode_returns"])
        now = time.monotonic()
        off = self.offset
        counters = {"env_steps": off["env_steps"] + sum(r["env_steps"] for r in runners),
                    "produced": off["produced"] + sum(r["produced"] for r in runners),
                    "labeled": off["labeled"] + sum(l["labeled"] for l in labelers),
                    "stored": learner["stored"], "updates": learner["updates"],
                    "labeler_busy_s": sum(l["busy_s"] for l in labelers), "t": now}
        prev, self._previous = self._previous or {**counters, **off, "t": self.started}, counters
        dt = max(now - prev["t"], 1e-9)
        rate = lambda key: (counters[key] - prev[key]) / dt  # noqa: E731
        elapsed = now - self.started + off["wall_s"]
        total = int(self.cfg.total_env_steps)
        lags = [l["labeling_lag_s"] for l in labelers if l["labeling_lag_s"] > 0]
        losses = {k: learner[k] for k in ("critic_loss", "actor_loss", "alpha", "entropy") if k in learner}
        return {
            "env_steps": counters["env_steps"], "wall_s": round(elapsed, 3),
            "env_steps_per_s": rate("env_steps"), "labeled_per_s": rate("labeled"), "updates_per_s": rate("updates"),
            "labeling_lag_s": float(np.mean(lags)) if lags else None,
            "labeled_fraction": counters["labeled"] / max(counters["produced"], 1),
            "labeler_busy_fraction": rate("labeler_busy_s") / max(len(labelers), 1),
            "transitions_produced": counters["produced"], "transitions_labeled": counters["labeled"],
            "transitions_stored": counters["stored"], "updates": counters["updates"],
            "buffer_size": learner["buffer_size"], "policy_version": learner["policy_version"],
            "policy_staleness": learner["policy_staleness"], "duplicates": learner["duplicates"],
            "transitions_quarantined": learner["quarantined"], "reward_retries": sum(l["retries"] for l in labelers),
            "reward_last_error": next((l["last_error"] for l in labelers if l["last_error"]), None),
            "episodes": self.episodes,
            "episode_return_mean": float(np.mean(self.returns)) if self.returns else None,
            "eta_s": (total - counters["env_steps"]) / max(counters["env_steps"] - off["env_steps"], 1) * (now - self.started),
            **losses,
        }

    def _summary(self, row: dict) -> dict:
        keys = ("env_steps", "transitions_produced", "transitions_labeled", "transitions_stored",
                "transitions_quarantined", "reward_retries", "reward_last_error", "updates",
                "episodes", "episode_return_mean", "duplicates", "policy_version")
        return {k: row[k] for k in keys} | {"wall_s": round(self.offset["wall_s"] + time.monotonic() - self.started, 2),
                                             "restarts": self.epoch}


def _accounted(learner_stats: dict) -> int:
    """Transitions the learner has settled: stored, or reported quarantined by a labeler."""
    return learner_stats["stored"] + learner_stats["quarantined"]


def _one_line(error: Exception) -> str:
    """The innermost message of a Ray error, on one line."""
    cause = getattr(error, "cause", None) or error
    text = str(cause).strip().splitlines()
    last = next((line for line in reversed(text) if line.strip()), type(cause).__name__)
    return f"a role failed: {type(cause).__name__}: {last.strip()}"

"""PPO driver (on-policy family on gymnasium envs): act → learn → publish, synchronously.

Each cycle every env runner collects a fixed-length rollout with the newest weights, the learner computes GAE
and runs the PPO epochs on all of them, then publishes the next weight version. Only object refs pass
through here: rollouts go runner → learner and weights learner → runners straight through the object store;
the driver receives the finished episodes' returns and the learner's loss metrics.
"""
from __future__ import annotations

import logging
import time
from collections import deque

import numpy as np
import ray
from omegaconf import DictConfig, OmegaConf

from rlfarm.envs.spaces import env_policy_dims
from rlfarm.loops.checkpoints import PeriodicCheckpoints
from rlfarm.roles.ppo_learner import PPOLearner
from rlfarm.roles.rollout import RolloutRunner
from rlfarm.run import Run
from rlfarm.telemetry.live import LiveView
from rlfarm.topology import PlacedTopology

log = logging.getLogger("rlfarm")

RETURN_WINDOW = 10  # episode_return_mean is over the last 10 finished episodes, as in the off-policy family
LEARNER_KEYS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "explained_variance",
                "grad_norm", "gradient_steps", "lr", "staleness", "update_s")


class PPOLoop(PeriodicCheckpoints):
    def __init__(self, cfg: DictConfig, run: Run, placed: PlacedTopology, resume_from: str | None = None):
        self.cfg, self.run = cfg, run
        as_dict = lambda node: OmegaConf.to_container(node, resolve=True)  # noqa: E731 - plain dicts travel to actors
        plan, seed = placed.plan, int(cfg.seed)
        self.runners = [
            ray.remote(RolloutRunner).options(**placed.options(p)).remote(
                p.index, as_dict(cfg.env), as_dict(cfg.model.actor), seed, int(cfg.algo.rollout_steps), p.threads)
            for p in plan.of("env_runner")]
        # The spaces come from the env id, not from a runner, so the learner starts while the runners do.
        spaces = env_policy_dims(str(cfg.env.id), as_dict(cfg.env.kwargs) if cfg.env.get("kwargs") else {})
        (learner,) = plan.of("learner")
        self.learner = ray.remote(PPOLearner).options(**placed.options(learner)).remote(
            as_dict(cfg.algo), as_dict(cfg.model.actor), spaces, seed, learner.threads)
        self.envs_per_step = len(self.runners) * int(cfg.env.num_envs)  # env steps per vector step of all runners
        self.returns: deque[float] = deque(maxlen=RETURN_WINDOW)
        self.episodes = self.env_steps = 0
        self.wall_offset = 0.0
        self.started = time.monotonic()
        self._start_checkpoints()
        if resume_from:
            self._resume(resume_from)

    def train(self) -> dict:
        target = self.cfg.algo.target_return
        weights = self.learner.publish.remote()  # the runners start from the learner's weights
        ray.get([weights, *(r.spaces.remote() for r in self.runners)])  # the clock counts training, not start-up
        self.started = time.monotonic()
        row: dict = {}
        title = f"rlfarm · ppo · {self.cfg.env.id} · {self.cfg.topology.name}"
        with self.until_preempted(), LiveView(title, self.cfg.run.live, columns="ppo") as view:
            while (steps := self._rollout_steps()) > 0:
                progress = self.env_steps / int(self.cfg.total_env_steps)
                collected = [r.collect.options(num_returns=2).remote(weights, steps) for r in self.runners]  # 1. act
                metrics = self.learner.update.remote(progress, *(rollout for rollout, _ in collected))  # 2. GAE + PPO
                weights = self.learner.publish.remote()                                                # 3. publish
                episodes = ray.get([finished for _, finished in collected])                            # 4. record
                row = self._record(steps, episodes, ray.get(metrics))
                view.update(row)
                self._after_update(row["updates"])
                if self._done(row, target):
                    break
        return self._summary(row, target)

    # -- stages -------------------------------------------------------------------------------------
    def _rollout_steps(self) -> int:
        """Vector steps for the next cycle: rollout_steps, fewer at the end so env_steps never passes the budget."""
        left = int(self.cfg.total_env_steps) - self.env_steps
        return min(int(self.cfg.algo.rollout_steps), left // self.envs_per_step)

    def _record(self, steps: int, episodes: list[dict], learner: dict) -> dict:
        for finished in episodes:
            self.returns.extend(finished["returns"])
            self.episodes += len(finished["returns"])
        self.env_steps += steps * self.envs_per_step
        wall = self.wall_offset + time.monotonic() - self.started
        rate = self.env_steps / max(wall, 1e-9)
        row = {"env_steps": self.env_steps, "updates": learner["updates"], "wall_s": round(wall, 3),
               "env_steps_per_s": rate, "episodes": self.episodes,
               "episode_return_mean": float(np.mean(self.returns)) if self.returns else None,
               "policy_version": learner["policy_version"], "rollout_s": max(e["collect_s"] for e in episodes),
               "eta_s": (int(self.cfg.total_env_steps) - self.env_steps) / max(rate, 1e-9),
               **{k: learner[k] for k in LEARNER_KEYS if k in learner}}
        self.run.log(row)
        return row

    def _done(self, row: dict, target) -> bool:
        over_time = self.cfg.run.max_wall_s and row["wall_s"] > self.cfg.run.max_wall_s
        reached = target is not None and len(self.returns) == RETURN_WINDOW and row["episode_return_mean"] >= target
        if over_time:
            log.info("run.max_wall_s=%s reached: stopping", self.cfg.run.max_wall_s)
        return bool(over_time or reached)

    def _summary(self, row: dict, target) -> dict:
        ret = row.get("episode_return_mean")
        return {"env_steps": self.env_steps, "updates": row.get("updates", 0),
                "gradient_steps": row.get("gradient_steps", 0), "episodes": self.episodes,
                "episode_return_mean": ret, "policy_version": row.get("policy_version", 0),
                "wall_s": round(self.wall_offset + time.monotonic() - self.started, 2),
                "env_steps_per_s": row.get("env_steps_per_s", 0.0), "target_return": target,
                "reached_target": bool(target is not None and ret is not None and ret >= target)}

    # -- checkpoints ---------------------------------------------------------------------------------
    def checkpoint(self, name: str = "final.pt") -> str:
        extra = {"env_steps": self.env_steps, "episodes": self.episodes, "returns": list(self.returns),
                 "wall_s": self.wall_offset + time.monotonic() - self.started}
        return ray.get(self.learner.save.remote(str(self.run.checkpoint_dir / name), extra))

    def _resume(self, path: str) -> None:
        """Continue from a checkpoint: the learner restores weights and optimizer; counters continue.
        Episodes that were running at the checkpoint are lost: the runners start fresh ones."""
        extra = ray.get(self.learner.load.remote(path))
        self.env_steps, self.episodes = int(extra["env_steps"]), int(extra["episodes"])
        self.returns.extend(extra["returns"])
        self.wall_offset = float(extra["wall_s"])
        self.run.truncate_metrics(after_step=self.env_steps)
        log.info("resumed from %s at %d env steps", path, self.env_steps)

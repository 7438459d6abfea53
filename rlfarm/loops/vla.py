"""VLA driver (SimpleVLA-RL's recipe): rollout workers play GRPO groups in the simulator, the learner updates,
weights go back to the workers, synchronously.

    seeds → workers.collect (pipelined env groups + policy inference) → learner.update (GRPO) → learner.publish

Each update draws `groups_per_update` initial-state seeds, split across the env-runner workers; every seed is
played `group_size` times (a GRPO group: the same initial state and instruction, different action samples).
Only object refs pass through here, apart from the workers' small timing stats and the learner's metrics.
"""
from __future__ import annotations

import logging
import time
from collections import deque

import numpy as np
import ray
from omegaconf import DictConfig, OmegaConf

from rlfarm.envs.vla_tasks import check_vla_task
from rlfarm.errors import ConfigError
from rlfarm.loops.checkpoints import PeriodicCheckpoints
from rlfarm.roles.vla import VLAConfig, VLALearner, VLARolloutWorker
from rlfarm.run import Run
from rlfarm.telemetry.live import LiveView
from rlfarm.topology import PlacedTopology

log = logging.getLogger("rlfarm")
SUCCESS_WINDOW = 10  # summary success_rate: mean over the last 10 updates' rollouts
TIME_KEYS = ("rollout_s", "env_s", "infer_s", "overlap_s", "update_s", "step_s", "env_steps_per_s")


def vla_config(cfg: DictConfig) -> VLAConfig:
    """The frozen settings of one VLA run, from the composed Hydra config."""
    algo = OmegaConf.to_container(cfg.algo, resolve=True)
    fields = {k: v for k, v in algo.items() if k in VLAConfig.__dataclass_fields__}
    env = OmegaConf.to_container(cfg.env, resolve=True)
    check_vla_task(str(env["id"]))
    return VLAConfig(**fields, env_id=str(env["id"]), env=dict(env.get("kwargs") or {}), chunk_size=int(env["chunk_size"]),
                     bins=int(env.get("bins", 256)), model=vla_model(cfg.model),
                     seed=int(cfg.seed))


def vla_model(model: DictConfig) -> dict:
    """`model.config` for the roles, with `model.source` (an HF checkpoint folder, model=hf_vla) when set."""
    config = OmegaConf.to_container(model.config, resolve=True)
    return config | ({"source": str(model.source)} if model.get("source") else {})


def split_groups(groups: int, workers: int) -> list[int]:
    """Groups per worker, as even as possible; every worker gets at least one."""
    if groups < workers:
        raise ConfigError(f"algo.groups_per_update={groups} is fewer than the {workers} env runners",
                          f"set algo.groups_per_update >= {workers} or fewer topology.roles.env_runner.count")
    return [len(part) for part in np.array_split(np.arange(groups), workers)]


class VLALoop(PeriodicCheckpoints):
    def __init__(self, cfg: DictConfig, run: Run, placed: PlacedTopology, resume_from: str | None = None):
        self.cfg, self.run = cfg, run
        self.vla = vla_config(cfg)
        plan = placed.plan
        runners = plan.of("env_runner")
        self.shares = split_groups(self.vla.groups_per_update, len(runners))
        self.workers = [ray.remote(VLARolloutWorker).options(**placed.options(p)).remote(self.vla, share, p.index,
                                                                                          p.threads)
                        for p, share in zip(runners, self.shares)]
        (learner,) = plan.of("learner")
        shapes = ray.get(self.workers[0].shapes.remote())  # sizes the learner's policy without an env of its own
        self.learner = ray.remote(VLALearner).options(**placed.options(learner)).remote(self.vla, shapes,
                                                                                      learner.threads)
        self.successes: deque[float] = deque(maxlen=SUCCESS_WINDOW)
        self.times: dict[str, list[float]] = {key: [] for key in TIME_KEYS}
        self.first_success: float | None = None
        self.env_steps = self.episodes = 0
        self.updates, self.wall_offset = 0, 0.0  # updates done (a resumed run continues after them)
        self.started = time.monotonic()
        self._start_checkpoints()
        if resume_from:
            self._resume(resume_from)

    def train(self) -> dict:
        weights = self.learner.publish.remote()
        ray.get([weights, *(w.load_weights.remote(None) for w in self.workers)])  # the clock counts training only
        self.started = time.monotonic()
        target, row = self.cfg.algo.target_success, {}
        title = f"rlfarm · simplevla · {self.cfg.env.id} · {self.cfg.topology.name}"
        with self.until_preempted(), LiveView(title, self.cfg.run.live, columns="onpolicy") as view:
            for update in range(self.updates + 1, int(self.cfg.algo.max_updates) + 1):
                weights, row = self._step(update, weights)
                view.update(row)
                self._after_update(update)
                if self._done(row, target):
                    break
        return self._summary(row, target)

    def _step(self, update: int, weights) -> tuple:
        """One cycle: collect (workers) → update (learner) → publish. Returns (new weights ref, row)."""
        started = time.monotonic()
        seeds = self._seeds(update)
        collected = [w.collect.options(num_returns=2).remote(weights, s) for w, s in zip(self.workers, seeds)]
        stats = ray.get([s for _, s in collected])                                       # 1. rollouts
        rolled = time.monotonic()
        metrics = ray.get(self.learner.update.remote(*(batch for batch, _ in collected)))  # 2. GRPO update
        weights = self.learner.publish.remote()                                         # 3. new weights
        ray.wait([weights], fetch_local=False)
        done = time.monotonic()
        return weights, self._record(update, stats, metrics, rolled - started, done - rolled, done - started)

    def _seeds(self, update: int) -> list[list[int]]:
        """Initial-state seeds of this update, one list per worker; distinct across updates and runs."""
        first = int(self.cfg.seed) * 1_000_003 + (update - 1) * self.vla.groups_per_update
        bounds = np.cumsum([0, *self.shares])
        return [list(range(first + lo, first + hi)) for lo, hi in zip(bounds[:-1], bounds[1:])]

    def _record(self, update: int, stats: list[dict], metrics: dict, rollout_s: float, update_s: float,
                step_s: float) -> dict:
        steps = sum(s["env_steps"] for s in stats)
        self.updates = update
        self.env_steps += steps
        self.episodes += sum(s["episodes"] for s in stats)
        self.successes.append(metrics["success_rate"])
        if self.first_success is None:
            self.first_success = metrics["success_rate"]
        # the slowest worker sets the pace; its breakdown is the one that matters
        slowest = max(stats, key=lambda s: s["rollout_s"])
        timing = {"rollout_s": rollout_s, "env_s": slowest["env_s"], "infer_s": slowest["infer_s"],
                  "overlap_s": slowest["overlap_s"], "update_s": update_s, "step_s": step_s,
                  "env_steps_per_s": steps / max(rollout_s, 1e-9)}
        for key in TIME_KEYS:
            self.times[key].append(timing[key])
        wall = self.wall_offset + time.monotonic() - self.started
        success = float(np.mean(self.successes))
        row = {"updates": update, "env_steps": self.env_steps, "samples": self.episodes, "wall_s": round(wall, 3),
               "success_rate_mean": success, "reward": metrics["success_rate"], "reward_mean": success, "inference_calls": slowest["inference_calls"],
               "inference_busy": slowest["infer_s"] / max(slowest["rollout_s"], 1e-9), **timing, **metrics}
        self.run.log(row)
        if update % 10 == 0 or update == 1:
            log.info("update %d success %.3f (last %d: %.3f) entropy %.2f kept %.2f rollout %.2fs (env %.2fs, "
                     "inference %.2fs, overlap %.2fs) wall %.0fs", update, metrics["success_rate"], len(self.successes),
                     success, metrics["entropy"], metrics["kept_groups"], rollout_s, timing["env_s"],
                     timing["infer_s"], timing["overlap_s"], wall)
        return row

    def _done(self, row: dict, target) -> bool:
        over_time = self.cfg.run.max_wall_s and row["wall_s"] > self.cfg.run.max_wall_s
        reached = (target is not None and len(self.successes) == SUCCESS_WINDOW
                   and row["success_rate_mean"] >= target)
        return bool(over_time or reached)

    def _summary(self, row: dict, target) -> dict:
        success = row.get("success_rate_mean", 0.0)
        return {"success_rate": success, "success_rate_start": self.first_success, "reward_mean": success,
                "updates": row.get("updates", 0), "samples": self.episodes, "env_steps": self.env_steps,
                "wall_s": round(self.wall_offset + time.monotonic() - self.started, 2), "target_success": target,
                "reached_target": bool(target is not None and success >= target),
                "target_reward": target, "pipeline": self.vla.pipeline, "rollout_workers": len(self.workers),
                "median": {key: round(float(np.median(v)), 4) for key, v in self.times.items() if v}}

    # -- checkpoints ---------------------------------------------------------------------------------
    def checkpoint(self, name: str = "final.pt") -> str:
        extra = {"updates": self.updates, "env_steps": self.env_steps,
                 "episodes": self.episodes, "successes": list(self.successes), "first_success": self.first_success,
                 "times": self.times, "wall_s": self.wall_offset + time.monotonic() - self.started}
        return ray.get(self.learner.save.remote(str(self.run.checkpoint_dir / name), extra))

    def _resume(self, path: str) -> None:
        """Continue after the checkpoint's update: the learner restores weights, optimizer and version; the
        counters, the success window and the timings continue. Seeds depend on the update number, so the
        resumed run draws the initial states the uninterrupted one would have."""
        extra = ray.get(self.learner.load.remote(path))
        self.updates = int(extra["updates"])
        self.env_steps, self.episodes = int(extra["env_steps"]), int(extra["episodes"])
        self.successes.extend(extra["successes"])
        self.first_success = extra["first_success"]
        self.times = {key: list(extra["times"].get(key, [])) for key in TIME_KEYS}
        self.wall_offset = float(extra["wall_s"])
        self._start_checkpoints(self.updates)
        self.run.truncate_metrics(after_step=self.env_steps)
        log.info("resumed from %s after update %d", path, self.updates)

"""PPOLearner role: GAE + PPO epochs on the runners' rollouts, then versioned weight publication.

It holds the actor-critic and its optimizer; `update` takes the rollouts of one synchronous cycle (Ray hands
them over straight from the runners' object store entries, never through the driver), and `publish` puts the
new weights in the object store once, so every runner fetches the same copy.
"""
from __future__ import annotations

import os
import time

import ray
import torch
from hydra.utils import instantiate

from rlfarm.algos.ppo_trainer import PPOConfig, flatten_for_update, ppo_update
from rlfarm.buffers.rollout import EnvRollout
from rlfarm.roles.base import role
from rlfarm.roles.common import assigned_device, limit_threads, save_atomic, seed_everything
from rlfarm.roles.stage_clock import StageClock
from rlfarm.sync.object_store import Publication, publication


@role("learner")
class PPOLearner:
    """Started with a "watch" concurrency group (`rlfarm.loops.deadlines.WATCH`): `stats` answers mid-update."""

    def __init__(self, algo_cfg: dict, actor_cfg: dict, spaces: dict, seed: int, threads: int = 1):
        limit_threads(threads)
        seed_everything(seed)
        self.cfg = PPOConfig.from_mapping(algo_cfg)
        self.device = assigned_device()
        self.model = instantiate(actor_cfg)(spaces["obs_dim"], spaces["act_dim"], spaces["action_low"],
                                            spaces["action_high"]).to(self.device)
        # eps=1e-5 rather than Adam's 1e-8: the PPO baselines' choice, steadier with normalized advantages
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.cfg.lr, eps=1e-5)
        self.generator = torch.Generator(self.device).manual_seed(seed)  # minibatch shuffles
        self.version = self.updates = self.gradient_steps = 0
        self.stages = StageClock("update", "publish")

    @ray.method(concurrency_group="watch")
    def stats(self) -> dict:
        return {"pid": os.getpid(), "stage_s": self.stages.snapshot(), "updates": self.updates,
                "policy_version": self.version}

    def publish(self) -> Publication:
        """A new weight version, put in the object store once for every runner."""
        self.version += 1
        with self.stages.timing("publish"):
            return publication({k: v.detach().cpu() for k, v in self.model.state_dict().items()}, self.version)

    def update(self, progress: float, *rollouts: EnvRollout) -> dict:
        """One PPO iteration on the runners' rollouts (same length and weight version, joined side by side).
        progress: share of the run's env steps done before these rollouts, for the learning-rate schedule."""
        with self.stages.timing("update"):
            return self._update(progress, rollouts)

    def _update(self, progress: float, rollouts: tuple[EnvRollout, ...]) -> dict:
        started = time.perf_counter()
        rollout = EnvRollout.concat(list(rollouts))
        lr = self.cfg.lr * (1.0 - progress) if self.cfg.anneal_lr else self.cfg.lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.train()
        metrics = ppo_update(self.model, self.optimizer, flatten_for_update(rollout, self.cfg, self.device),
                             self.cfg, self.generator)
        self.updates += 1
        self.gradient_steps += metrics["gradient_steps"]
        return {**metrics, "updates": self.updates, "gradient_steps": self.gradient_steps, "lr": lr,
                "policy_version": rollout.policy_version, "staleness": self.version - rollout.policy_version,
                "update_s": time.perf_counter() - started}

    def save(self, path: str, extra: dict | None = None) -> str:
        """Atomic checkpoint, loadable with torch.load(weights_only=True); `rlfarm eval` reads agent.actor."""
        state = {"agent": {"actor": self.model.state_dict(), "optimizer": self.optimizer.state_dict()},
                 "updates": self.updates, "version": self.version, "gradient_steps": self.gradient_steps,
                 "torch_rng": torch.get_rng_state(), "generator": self.generator.get_state(), "extra": extra or {}}
        return save_atomic(state, path)

    def load(self, path: str) -> dict:
        """Restore a checkpoint written by `save`. Returns its `extra` (the driver's counters)."""
        state = torch.load(path, map_location=self.device, weights_only=True)
        self.model.load_state_dict(state["agent"]["actor"])
        self.optimizer.load_state_dict(state["agent"]["optimizer"])
        self.updates, self.version = int(state["updates"]), int(state["version"])
        self.gradient_steps = int(state["gradient_steps"])
        torch.set_rng_state(state["torch_rng"].cpu())
        self.generator.set_state(state["generator"].cpu())
        return dict(state["extra"])

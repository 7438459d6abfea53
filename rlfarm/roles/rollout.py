"""RolloutRunner role: steps a vector env with its own copy of an actor-critic and returns fixed-length
on-policy rollouts (the PPO family's env runner).

Unlike the off-policy EnvRunner, which streams chunks on credits, this runner acts only when asked: the
driver hands it the learner's newest publication (`receive_weights`) and calls `collect` once per synchronous
cycle. The runner acts T steps in each of its N envs with the weights it holds, and records what
the learner needs: log π_old and V_old from the acting weights, and V_old of each step's true next state,
so that GAE can bootstrap through time-limit truncations without a second look at the env. Episodes run on
across rollouts; only their returns and lengths go back to the driver, apart from the rollout itself.
"""
from __future__ import annotations

import os
import time

import numpy as np
import ray
import torch
from hydra.utils import instantiate

from rlfarm.buffers.rollout import EnvRollout
from rlfarm.envs.spaces import policy_dims
from rlfarm.envs.vector import VectorEnv
from rlfarm.roles.base import role
from rlfarm.roles.common import limit_threads, seed_everything
from rlfarm.roles.stage_clock import StageClock
from rlfarm.sync.object_store import HeldWeights, Publication


@role("runner")
class RolloutRunner:
    """Started with a "watch" concurrency group (`rlfarm.loops.deadlines.WATCH`): `stats` answers mid-rollout."""

    def __init__(self, index: int, env_cfg: dict, actor_cfg: dict, seed: int, rollout_steps: int, threads: int = 1):
        limit_threads(threads)
        seed_everything(seed + 7919 * index)
        self.index, self.rollout_steps = index, int(rollout_steps)
        self.env = VectorEnv(env_cfg["id"], int(env_cfg.get("num_envs", 1)), seed + 1000 * index, None,
                             dict(env_cfg.get("kwargs") or {}), int(env_cfg.get("workers", 0)))
        self.dims = policy_dims(self.env.single_observation_space, self.env.single_action_space)
        self.policy = instantiate(actor_cfg)(self.dims["obs_dim"], self.dims["act_dim"], self.dims["action_low"],
                                             self.dims["action_high"]).eval()
        self.weights = HeldWeights()
        self.obs = self.env.reset()
        self.env_steps = 0
        self.stages = StageClock("collect")

    def spaces(self) -> dict:
        return dict(self.dims)

    def receive_weights(self, published: Publication) -> int:
        """The learner's `publish` (loaded once per version); the version now held."""
        self.weights.load_newer(published, self.policy.load_state_dict)
        return self.weights.version

    @ray.method(concurrency_group="watch")
    def stats(self) -> dict:
        return {"pid": os.getpid(), "stage_s": self.stages.snapshot(), "policy_version": self.weights.version,
                "env_steps": self.env_steps}

    def collect(self, steps: int | None = None) -> tuple[EnvRollout, dict]:
        """Act `steps` (default rollout_steps) vector steps with the weights held. Returns (rollout, episodes):
        episodes = {"returns", "lengths", "env_steps", "runner", "collect_s"}."""
        with self.stages.timing("collect"):
            return self._collect(steps)

    @torch.no_grad()
    def _collect(self, steps: int | None) -> tuple[EnvRollout, dict]:
        started = time.perf_counter()
        steps = self.rollout_steps if steps is None else int(steps)
        obs_t = torch.as_tensor
        record: dict[str, list] = {name: [] for name in EnvRollout.ARRAYS}
        returns: list[float] = []
        lengths: list[int] = []
        obs = self.obs
        for _ in range(steps):
            action, logprob, value = self.policy.sample(obs_t(obs).reshape(len(obs), -1))
            step = self.env.step(self.policy.to_env(action).numpy())
            next_value = np.zeros(len(obs), dtype=np.float32)  # V(s_{t+1}) of done steps; the rest below
            done = np.flatnonzero(step.terminated | step.truncated)
            if len(done):
                # The reset obs is what the policy sees next; the true next state of a done step is its final
                # obs, whose value GAE needs on truncation.
                next_value[done] = self.policy.value(obs_t(step.next_obs[done]).reshape(len(done), -1)).numpy()
            for name, item in (("obs", obs), ("action", action.numpy()), ("logprob", logprob.numpy()),
                               ("value", value.numpy()), ("reward", step.env_reward),
                               ("terminated", step.terminated), ("truncated", step.truncated),
                               ("next_value", next_value)):
                record[name].append(item)
            returns.extend(step.episode_returns)
            lengths.extend(step.episode_lengths)
            obs = step.obs
        self.obs = obs
        self.env_steps += steps * len(obs)
        last_value = self.policy.value(obs_t(obs).reshape(len(obs), -1)).numpy()
        arrays = {name: np.stack(items) for name, items in record.items()}
        # V(s_{t+1}) of a step that did not end its episode is V of the next recorded obs.
        following = np.concatenate([arrays["value"][1:], last_value[None]], axis=0)
        done = arrays["terminated"] | arrays["truncated"]
        arrays["next_value"] = np.where(done, arrays["next_value"], following)
        rollout = EnvRollout(**arrays, policy_version=self.weights.version)
        episodes = {"runner": self.index, "returns": returns, "lengths": lengths,
                    "env_steps": self.env_steps, "collect_s": time.perf_counter() - started}
        return rollout, episodes

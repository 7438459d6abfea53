"""A gymnasium env whose step costs a fixed CPU time: the CPU-bound env stage of `rlfarm bench pipeline`.

The step spins (it does not sleep), so it takes a core the way physics or rendering does, and N runners on N
cores step at most N / step_cpu_ms. Registered as `rlfarm/FixedCost-v0`; runners make it from
`env.id=rlfarm.bench.fixed_cost_env:rlfarm/FixedCost-v0` (gymnasium imports this module first).
"""
from __future__ import annotations

import time

import gymnasium as gym
import numpy as np

ENV_ID = "rlfarm/FixedCost-v0"
MODULE_ENV_ID = f"{__name__}:{ENV_ID}"


class FixedCostEnv(gym.Env):
    """obs: [obs_dim] float32 that drifts with the actions; reward −‖a‖²; never terminates (episodes are cut
    by the registered time limit)."""

    def __init__(self, step_cpu_ms: float = 1.0, obs_dim: int = 8, act_dim: int = 2):
        self.step_s = float(step_cpu_ms) / 1e3
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (act_dim,), np.float32)
        self._obs = np.zeros(obs_dim, dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._obs = self.np_random.standard_normal(self._obs.shape).astype(np.float32)
        return self._obs.copy(), {}

    def step(self, action):
        deadline = time.perf_counter() + self.step_s
        while time.perf_counter() < deadline:  # spin: the cost is CPU time, as with a simulator
            pass
        action = np.asarray(action, dtype=np.float32).reshape(-1)
        self._obs = 0.9 * self._obs + 0.1 * np.resize(action, self._obs.shape)
        return self._obs.copy(), -float(np.square(action).sum()), False, False, {}


if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point=FixedCostEnv, max_episode_steps=1000)

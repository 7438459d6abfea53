"""On-policy rollout storage: T steps of N envs, time-major, as plain numpy arrays.

A rollout is what an env runner sends the PPO learner: everything GAE and the PPO loss need, recorded by the
policy copy that acted, so the learner needs no env and no second forward pass over the states to start.
It travels through the object store once (numpy arrays are zero-copy there) and is used once.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class EnvRollout:
    """T steps of N envs acted on by one policy version.

    obs: [T, N, obs_dim] float32, the states acted on.
    action: [T, N] int64 (discrete) or [T, N, act_dim] float32, the raw sample (before clipping to the box).
    logprob, value: [T, N] float32, log π_old(a|s) and V_old(s) of the acting weights.
    reward: [T, N] float32, the env's own reward.
    terminated, truncated: [T, N] bool.
    next_value: [T, N] float32, V_old(s_{t+1}) of the state step t really led to: on a done step the value
        of the final observation (not the next episode's reset), after the last step the bootstrap value.
        GAE uses it on truncation (time ran out; the state still had value) and ignores it on termination.
    policy_version: the weight version that acted (0: the runner's initial weights).
    """

    obs: np.ndarray
    action: np.ndarray
    logprob: np.ndarray
    value: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    next_value: np.ndarray
    policy_version: int = 0

    ARRAYS = ("obs", "action", "logprob", "value", "reward", "terminated", "truncated", "next_value")

    @property
    def steps(self) -> int:
        """T: vector-env steps per env."""
        return int(self.reward.shape[0])

    @property
    def num_envs(self) -> int:
        return int(self.reward.shape[1])

    @property
    def transitions(self) -> int:
        """T × N env steps."""
        return int(self.reward.size)

    @staticmethod
    def concat(rollouts: list["EnvRollout"]) -> "EnvRollout":
        """Rollouts of several runners side by side: [T, N1 + N2 + ..., ...]. They must share T and version."""
        if len({r.steps for r in rollouts}) != 1 or len({r.policy_version for r in rollouts}) != 1:
            raise ValueError("rollouts to join must have the same length and policy version, got "
                             f"{[(r.steps, r.policy_version) for r in rollouts]}")
        if len(rollouts) == 1:
            return rollouts[0]
        joined = {name: np.concatenate([getattr(r, name) for r in rollouts], axis=1) for name in EnvRollout.ARRAYS}
        return EnvRollout(**joined, policy_version=rollouts[0].policy_version)

    def tensors(self, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        """The arrays as torch tensors (copies: the object store hands out read-only arrays)."""
        return {name: torch.tensor(getattr(self, name), device=device) for name in self.ARRAYS}


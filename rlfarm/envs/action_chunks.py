"""Action chunks for VLA policies: OpenVLA-style action tokens and a wrapper that runs K actions per call.

`ActionTokenizer` maps each action dimension to one of `bins` (256) tokens, as OpenVLA does (Kim et al. 2024,
arXiv:2406.09246, §3.2): normalize each dimension to [-1, 1] with per-dimension statistics (the 1st and 99th
percentiles of the data, so that outliers do not stretch the bins, or plain min/max), clip, and split
[-1, 1] into `bins` equal bins; a token decodes to its bin's centre. The round trip is exact to half a bin
width inside the statistics' range (tests/envs/test_action_chunks.py checks it).

`ActionChunkWrapper` lets a policy emit K actions per call (OpenVLA-OFT, π0 and SimpleVLA-RL act in chunks):
one `step` runs them in order, sums the reward, stops early at termination or truncation, and reports
which of the executed steps counted as a success.
"""
from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np


@dataclass(frozen=True)
class ActionTokenizer:
    """low/high: [D] normalization bounds (q01/q99 or min/max of the data); bins: tokens per dimension."""

    low: np.ndarray
    high: np.ndarray
    bins: int = 256

    def __post_init__(self):
        low, high = np.asarray(self.low, np.float64), np.asarray(self.high, np.float64)
        if low.shape != high.shape or low.ndim != 1 or np.any(high <= low):
            raise ValueError(f"need 1-D low < high, got low={low}, high={high}")
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)

    @classmethod
    def from_data(cls, actions: np.ndarray, method: str = "quantile", bins: int = 256) -> "ActionTokenizer":
        """Statistics from a data set of actions [N, D]: method 'quantile' (q01/q99, OpenVLA) or 'minmax'."""
        actions = np.asarray(actions, np.float64).reshape(-1, np.shape(actions)[-1])
        if method == "quantile":
            low, high = np.quantile(actions, 0.01, axis=0), np.quantile(actions, 0.99, axis=0)
        elif method == "minmax":
            low, high = actions.min(axis=0), actions.max(axis=0)
        else:
            raise ValueError(f"method must be 'quantile' or 'minmax', got {method!r}")
        high = np.where(high > low, high, low + 1e-6)  # a constant dimension still needs a non-empty range
        return cls(low, high, bins)

    @property
    def action_dim(self) -> int:
        return len(self.low)

    @property
    def bin_width(self) -> np.ndarray:
        """[D] width of one bin in action units: the round-trip error is at most half of it."""
        return (self.high - self.low) / self.bins

    def normalize(self, actions: np.ndarray) -> np.ndarray:
        return np.clip(2.0 * (np.asarray(actions, np.float64) - self.low) / (self.high - self.low) - 1.0, -1.0, 1.0)

    def encode(self, actions: np.ndarray) -> np.ndarray:
        """actions [..., D] → tokens [..., D] in [0, bins)."""
        unit = (self.normalize(actions) + 1.0) / 2.0  # [0, 1]
        return np.minimum((unit * self.bins).astype(np.int64), self.bins - 1)

    def decode(self, tokens: np.ndarray) -> np.ndarray:
        """tokens [..., D] → actions [..., D] at the bin centres."""
        unit = (np.asarray(tokens, np.float64) + 0.5) / self.bins
        return (self.low + unit * (self.high - self.low)).astype(np.float32)


class ActionChunkWrapper(gym.Wrapper):
    """`step(chunk)` with chunk [K, D] runs up to K env steps; returns (obs, summed reward, terminated,
    truncated, info) where info holds `step_success` (one bool per executed step), `steps` (how many ran)
    and `success` (any step succeeded). The env reports success as `info["success"]` per step."""

    def __init__(self, env: gym.Env, chunk_size: int):
        super().__init__(env)
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.chunk_size = int(chunk_size)
        inner = env.action_space
        self.action_space = gym.spaces.Box(np.repeat(inner.low[None], chunk_size, 0),
                                           np.repeat(inner.high[None], chunk_size, 0), dtype=inner.dtype)

    def step(self, chunk):
        chunk = np.asarray(chunk).reshape(self.chunk_size, -1)
        total, step_success = 0.0, []
        terminated = truncated = False
        obs, info = None, {}
        for action in chunk:
            obs, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            step_success.append(bool(info.get("success", False)))
            if terminated or truncated:  # the episode is over: the rest of the chunk is dropped
                break
        info = dict(info, step_success=step_success, steps=len(step_success), success=any(step_success))
        return obs, total, terminated, truncated, info

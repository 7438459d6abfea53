"""A reward model that fails on purpose, for chaos tests of the labeling farm (and for users who want to
see what rlfarm does when their reward model breaks): it wraps another reward model and, on chosen
batches, raises or returns NaN.

    rlfarm train reward=faulty                       # env reward; every 4th call fails twice, then recovers
    rlfarm train reward=faulty reward.poison_env_reward_above=-0.5 reward.mode=nan   # a poisoned chunk
"""
from __future__ import annotations

import numpy as np
from hydra.utils import instantiate

from rlfarm.rewards.base import RewardModel, RewardModelError


class FaultyReward(RewardModel):
    """inner: a reward-model config node. mode: "raise" or "nan".
    fail_every / fail_times: calls number k·fail_every (k ≥ 1) fail, then the next fail_times − 1 calls too
    (a transient fault that a retry outlives when fail_times == 1).
    poison_env_reward_above: any batch holding a transition whose env reward exceeds this fails every time
    (a persistent fault tied to the data: only quarantine gets rid of it)."""

    def __init__(self, inner: dict, mode: str = "raise", fail_every: int = 0, fail_times: int = 1,
                 poison_env_reward_above: float | None = None, frame_size: int | None = None):
        if isinstance(mode, float) and np.isnan(mode):  # Hydra reads `reward.mode=nan` as a float
            mode = "nan"
        if mode not in ("raise", "nan"):
            raise RewardModelError(f"reward.mode must be 'raise' or 'nan', got {mode!r}")
        self.inner = instantiate(inner)
        self.needs = tuple(dict.fromkeys((*self.inner.needs, "env_reward")))
        self.frame_size = self.inner.frame_size
        self.mode, self.fail_every, self.fail_times = mode, fail_every, fail_times
        self.poison = poison_env_reward_above
        self.calls = 0
        self._failing_left = 0

    def setup(self, device: str) -> None:
        self.inner.setup(device)

    def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        self.calls += 1
        if self.fail_every and self.calls % self.fail_every == 0:
            self._failing_left = self.fail_times
        poisoned = self.poison is not None and bool((batch["env_reward"] > self.poison).any())
        if self._failing_left > 0 or poisoned:
            self._failing_left = max(self._failing_left - 1, 0)
            if self.mode == "raise":
                raise RuntimeError(f"injected reward-model failure (call {self.calls})")
            return np.full(len(batch["env_reward"]), np.nan, dtype=np.float32)
        return self.inner(batch)

"""A reward model that fails on purpose, for chaos tests of the labeling farm (and for users who want to
see what rlfarm does when their reward model breaks): it wraps another reward model and, on chosen
batches, raises, returns NaN, or hangs.

    rlfarm train reward=faulty                       # env reward; every 4th call fails twice, then recovers
    rlfarm train reward=faulty reward.poison_env_reward_above=-0.5 reward.mode=nan   # a poisoned chunk
    rlfarm train reward=faulty reward.mode=hang reward.hang_s=300 run.role_timeout_s=30
        # every 4th call takes 5 minutes: the driver names the labeler after 30 s and has Ray restart it
        # (reward.heal_on_restart=true: the restarted process labels normally; false: it hangs again on its
        # 4th call, until run.max_restarts is used up and the run ends with one line naming it)
"""
from __future__ import annotations

import time

import numpy as np
from hydra.utils import instantiate

from rlfarm.rewards.base import RewardModel, RewardModelError

MODES = ("raise", "nan", "hang")


class FaultyReward(RewardModel):
    """inner: a reward-model config node. mode: "raise", "nan" or "hang" (the call sleeps `hang_s`, then
    labels normally: a wedged GPU or a remote model that stopped answering).
    fail_every / fail_times: calls number k·fail_every (k ≥ 1) fail, then the next fail_times − 1 calls too
    (a transient fault that a retry outlives when fail_times == 1).
    poison_env_reward_above: any batch holding a transition whose env reward exceeds this fails every time
    (a persistent fault tied to the data: only quarantine gets rid of it).
    heal_on_restart: a labeler process that Ray restarted (after a death or a kill) never fails: the fault lived
    in the old process. Counts are per process: a restarted labeler counts its calls from zero.
    setup_hang_s: setup sleeps this long first (a model load that hangs: the driver names the labeler)."""

    def __init__(self, inner: dict, mode: str = "raise", fail_every: int = 0, fail_times: int = 1,
                 poison_env_reward_above: float | None = None, frame_size: int | None = None,
                 hang_s: float = 300.0, heal_on_restart: bool = False, setup_hang_s: float = 0.0):
        if isinstance(mode, float) and np.isnan(mode):  # Hydra reads `reward.mode=nan` as a float
            mode = "nan"
        if mode not in MODES:
            raise RewardModelError(f"reward.mode must be one of {'|'.join(MODES)}, got {mode!r}")
        if hang_s < 0:
            raise RewardModelError(f"reward.hang_s must be >= 0, got {hang_s}")
        self.inner = instantiate(inner)
        self.needs = tuple(dict.fromkeys((*self.inner.needs, "env_reward")))
        self.frame_size = self.inner.frame_size
        self.mode, self.fail_every, self.fail_times = mode, fail_every, fail_times
        self.poison = poison_env_reward_above
        self.hang_s, self.heal_on_restart = float(hang_s), heal_on_restart
        self.setup_hang_s = float(setup_hang_s)
        self.healed = False
        self.calls = 0
        self._failing_left = 0

    def setup(self, device: str) -> None:
        time.sleep(self.setup_hang_s)
        self.inner.setup(device)
        self.healed = self.heal_on_restart and _restarted_actor()

    def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        self.calls += 1
        if self.healed:
            return self.inner(batch)
        if self.fail_every and self.calls % self.fail_every == 0:
            self._failing_left = self.fail_times
        poisoned = self.poison is not None and bool((batch["env_reward"] > self.poison).any())
        if self._failing_left > 0 or poisoned:
            self._failing_left = max(self._failing_left - 1, 0)
            if self.mode == "raise":
                raise RuntimeError(f"injected reward-model failure (call {self.calls})")
            if self.mode == "hang":
                time.sleep(self.hang_s)
                return self.inner(batch)
            return np.full(len(batch["env_reward"]), np.nan, dtype=np.float32)
        return self.inner(batch)


def _restarted_actor() -> bool:
    """True inside a Ray actor that Ray has restarted (a new process after a death or a kill)."""
    import ray

    return ray.is_initialized() and ray.get_runtime_context().was_current_actor_reconstructed

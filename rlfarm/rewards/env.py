"""The environment's own reward, passed through the labeler (ground truth; baselines and tests)."""

import numpy as np

from rlfarm.rewards.base import RewardModel


class EnvReward(RewardModel):
    """Returns batch["env_reward"] [n] as float32.

    frame_size: frames to render anyway (e.g. to compare with a pixel reward later); None renders nothing.
    """

    needs = ("env_reward",)

    def __init__(self, frame_size: int | None = None):
        self.frame_size = frame_size

    def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        return np.asarray(batch["env_reward"], dtype=np.float32)

"""The reward-model interface the labelers run on large batches of raw transitions."""

import abc

import numpy as np


class RewardModelError(RuntimeError):
    """A reward model that cannot be loaded or that produced unusable rewards (message: one line with the fix)."""


class RewardModel(abc.ABC):
    """Maps a batch of n transitions to n rewards.

    needs: the chunk keys this model reads, e.g. ("env_reward",) or ("frames",); runners must emit them.
    frame_size: side of the square RGB frames the runners must render, None when the model reads no frames.
    frame_stack: how many consecutive renders each frame holds (1: the state after the step; 2: before and after).

    Constructed where the config is instantiated (cheap, picklable); `setup` loads weights once in the
    labeler process, on the device Ray gave it.
    """

    needs: tuple[str, ...]
    frame_size: int | None
    frame_stack: int = 1  # renders per frame, oldest first on the channels ([n, S, S, 3k]): 2 shows motion

    def setup(self, device: str) -> None:
        """Load weights onto device ("cpu", "cuda:0"). Models without weights need nothing here."""

    @abc.abstractmethod
    def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """batch: arrays with leading dim n for each key in `needs`. Returns [n] float32 rewards."""

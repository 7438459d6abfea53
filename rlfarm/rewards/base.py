"""The reward-model interface the labelers run on large batches of raw transitions."""

import abc

import numpy as np
import torch


class RewardModelError(RuntimeError):
    """A reward model that cannot be loaded or that produced unusable rewards (message: one line with the fix)."""


class RewardModel(abc.ABC):
    """Maps a batch of n transitions to n rewards.

    needs: the chunk keys this model reads, e.g. ("env_reward",) or ("frames",); runners must emit them.
    frame_size: side of the square RGB frames the runners must render, None when the model reads no frames.
    frame_stack: how many consecutive renders each frame holds (1: the state after the step; 2: before and after).
    takes_parts: keys the model accepts as a list of the bus's per-chunk arrays instead of one concatenated array
        (a model that copies its input into staging buffers anyway saves a host copy of every bus).
    stages: the labeler's StageClock, set before `setup` (None elsewhere): a model may time parts of its `start`
        under it (`StagedUpload` times its host copies as "upload"), which then count apart from the labeler's
        "launch" in the run's metrics.

    Constructed where the config is instantiated (cheap, picklable); `setup` loads weights once in the
    labeler process, on the device Ray gave it.
    """

    needs: tuple[str, ...]
    frame_size: int | None
    frame_stack: int = 1  # renders per frame, oldest first on the channels ([n, S, S, 3k]): 2 shows motion
    takes_parts: tuple[str, ...] = ()
    stages = None  # a StageClock (rlfarm/roles/stage_clock.py), handed over by the labeler

    def setup(self, device: str) -> None:
        """Load weights onto device ("cpu", "cuda:0"). Models without weights need nothing here."""

    def stats(self) -> dict:
        """The model's own numbers for the run's metrics (flat: names → int, float, bool or None), e.g. how a
        distilled reward's student agrees with its teacher. Asked from another thread while a call may run: return
        a snapshot, cheap, never waiting on the model."""
        return {}

    @abc.abstractmethod
    def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """batch: arrays with leading dim n for each key in `needs`. Returns [n] float32 rewards."""

    def start(self, batch: dict[str, np.ndarray]) -> "Pending":
        """Begin labeling `batch`; the labeler prepares its next bus while the call runs and then takes the
        result. A model on a GPU overrides this to queue its work and return at once (`OnDevice`); by default
        the call runs here, to the end."""
        return Pending(self(batch))


class Pending:
    """A reward-model call under way: `ready()` says (without blocking) whether `result()` would return at
    once; `result()` waits and returns the [n] rewards. This one is already done."""

    def __init__(self, rewards: np.ndarray):
        self._rewards = rewards

    def ready(self) -> bool:
        return True

    def result(self) -> np.ndarray:
        return self._rewards


class OnDevice(Pending):
    """Rewards still being computed on a CUDA device: copied to (pinned) host memory behind the queued work,
    with an event marking the copy's end, so neither starting nor polling the call blocks the labeler."""

    def __init__(self, rewards: torch.Tensor):
        self._host = rewards.float().to("cpu", non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record()

    def ready(self) -> bool:
        return self._copied.query()

    def result(self) -> np.ndarray:
        self._copied.synchronize()
        return self._host.numpy()

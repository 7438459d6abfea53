"""A reward model whose cost is known exactly: the env's own reward, delivered after `batch_ms` per model call
(per piece of at most `max_batch` transitions, as a real model runs a big bus in pieces) plus `item_us` per
transition. A stand-in for a big reward model wherever the cost matters more than the reward: benchmarks
(`rlfarm bench pipeline` checks the pipeline against what the labelers can do at most) and backpressure tests.

On CUDA the time is spent by a GPU kernel that spins (`torch.cuda._sleep`, calibrated against CUDA events in
`setup`), so the GPU is busy for as long as a real model would keep it and NVML sees it busy; on CPU the
labeler waits, leaving its core free, like a call to a remote model. Like a GPU model, `start` returns at once
(the labeler prepares its next bus meanwhile) and calls run one after another: a call started while another runs
is ready `cost_s` after that one.
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch

from rlfarm.rewards.base import OnDevice, Pending, RewardModel, RewardModelError

CALIBRATION_CYCLES = 20_000_000  # about 10 ms of spinning at a 2 GHz GPU clock: long enough to time well


class FixedCostReward(RewardModel):
    """batch_ms: cost of one model call on up to `max_batch` transitions; item_us: cost per transition."""

    needs = ("env_reward",)

    def __init__(self, batch_ms: float = 10.0, item_us: float = 100.0, max_batch: int = 512,
                 frame_size: int | None = None):
        if batch_ms < 0 or item_us < 0 or max_batch < 1:
            raise RewardModelError(f"fixed-cost reward needs batch_ms, item_us >= 0 and max_batch >= 1, "
                                   f"got {batch_ms}, {item_us}, {max_batch}")
        self.batch_ms, self.item_us, self.max_batch = float(batch_ms), float(item_us), int(max_batch)
        self.frame_size = frame_size
        self._device = torch.device("cpu")
        self._cycles_per_s: float | None = None
        self._free_at = 0.0  # (CPU) when the last call started ends

    def cost_s(self, n: int) -> float:
        """Seconds one call on n transitions takes."""
        return math.ceil(n / self.max_batch) * self.batch_ms / 1e3 + n * self.item_us / 1e6

    def setup(self, device: str) -> None:
        self._device = torch.device(device)
        if self._device.type == "cuda":
            self._cycles_per_s = spin_cycles_per_s(self._device)

    def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        return self.start(batch).result()

    def start(self, batch: dict[str, np.ndarray]) -> Pending:
        rewards = np.array(batch["env_reward"], dtype=np.float32).reshape(-1)
        seconds = self.cost_s(len(rewards))
        if self._cycles_per_s is None:
            self._free_at = max(self._free_at, time.monotonic()) + seconds
            return _ReadyAt(rewards, self._free_at)
        with torch.cuda.device(self._device):
            on_device = torch.from_numpy(rewards).to(self._device)  # before the spin: this copy waits for the stream
            torch.cuda._sleep(int(seconds * self._cycles_per_s))
            return OnDevice(on_device)


class _ReadyAt(Pending):
    """Rewards that a (simulated) remote model hands back at a monotonic time."""

    def __init__(self, rewards: np.ndarray, ready_at: float):
        super().__init__(rewards)
        self.ready_at = ready_at

    def ready(self) -> bool:
        return time.monotonic() >= self.ready_at

    def result(self) -> np.ndarray:
        time.sleep(max(self.ready_at - time.monotonic(), 0.0))
        return super().result()


def spin_cycles_per_s(device: torch.device) -> float:
    """How many cycles `torch.cuda._sleep` spins per second on this GPU (its clock under load)."""
    with torch.cuda.device(device):
        torch.cuda._sleep(CALIBRATION_CYCLES)  # the clock ramps up from idle: time the second spin
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(CALIBRATION_CYCLES)
        end.record()
        end.synchronize()
        return CALIBRATION_CYCLES / (start.elapsed_time(end) / 1e3)

"""Replay buffer = storage + sampler (the TorchRL split)."""
from __future__ import annotations

import numpy as np
import torch

from rlfarm.buffers.sampler import UniformSampler
from rlfarm.buffers.storage import TensorStorage


class ReplayBuffer:
    def __init__(self, storage: TensorStorage, sampler: UniformSampler):
        self.storage, self.sampler = storage, sampler

    def __len__(self) -> int:
        return len(self.storage)

    def extend(self, batch: dict[str, np.ndarray | torch.Tensor]) -> None:
        self.storage.extend(batch)

    def sample(self) -> dict[str, torch.Tensor]:
        if len(self.storage) == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        return self.storage.gather(self.sampler.sample(len(self.storage), self.storage.device))

    def state_dict(self) -> dict:
        return {"storage": self.storage.state_dict(), "sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.storage.load_state_dict(state["storage"])
        self.sampler.load_state_dict(state["sampler"])

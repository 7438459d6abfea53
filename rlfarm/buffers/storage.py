"""Ring-buffer storage of transitions as preallocated tensors on one device (CPU or GPU).

Keeping the storage on the learner's device makes sampling a local gather with no host copy.
"""
from __future__ import annotations

import numpy as np
import torch


class TensorStorage:
    """Fixed-capacity ring buffer of named fields. Allocated lazily from the first batch's shapes."""

    def __init__(self, capacity: int, device: str | torch.device = "cpu"):
        if capacity <= 0:
            raise ValueError(f"replay capacity must be positive, got {capacity}")
        self.capacity = int(capacity)
        self.device = torch.device(device)
        self.fields: dict[str, torch.Tensor] = {}
        self.cursor = 0  # next write position
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def _allocate(self, batch: dict[str, torch.Tensor]) -> None:
        for name, value in batch.items():
            self.fields[name] = torch.zeros((self.capacity, *value.shape[1:]), dtype=value.dtype, device=self.device)

    def extend(self, batch: dict[str, np.ndarray | torch.Tensor]) -> None:
        """Append n rows (every field has leading dim n); the oldest rows are overwritten when full."""
        batch = {k: torch.as_tensor(v).to(self.device, non_blocking=True) for k, v in batch.items()}
        if not self.fields:
            self._allocate(batch)
        n = next(iter(batch.values())).shape[0]
        if n > self.capacity:  # only the newest `capacity` rows can survive
            batch = {k: v[-self.capacity:] for k, v in batch.items()}
            n = self.capacity
        index = (torch.arange(n, device=self.device) + self.cursor) % self.capacity
        for name, value in batch.items():
            self.fields[name][index] = value
        self.cursor = (self.cursor + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def gather(self, index: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: field[index] for name, field in self.fields.items()}

    def state_dict(self) -> dict:
        # Save only the filled rows, in CPU memory.
        return {"capacity": self.capacity, "cursor": self.cursor, "size": self.size,
                "fields": {k: v[: self.size].cpu() for k, v in self.fields.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.capacity, self.cursor, self.size = int(state["capacity"]), int(state["cursor"]), int(state["size"])
        self.fields = {}
        for name, rows in state["fields"].items():
            field = torch.zeros((self.capacity, *rows.shape[1:]), dtype=rows.dtype, device=self.device)
            field[: rows.shape[0]] = rows.to(self.device)
            self.fields[name] = field

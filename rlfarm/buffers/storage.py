"""Ring-buffer storage of transitions as preallocated tensors on one device (CPU or GPU).

Keeping the storage on the learner's device makes sampling a local gather with no host copy.

Writing a batch is meant to be cheap on the thread that also runs the updates: each field is converted (e.g.
float64 observations → float32) in the same pass that copies it, straight into the ring on CPU; on CUDA the
fields are packed into one pinned host buffer and cross to the device as one asynchronous copy, then land in
the ring by slice copies on the device (no per-field host→device copies, no index tensors, no host sync).
"""
from __future__ import annotations

import numpy as np
import torch


class TensorStorage:
    """Fixed-capacity ring buffer of named fields. Allocated lazily from the first batch's shapes; every field
    is kept in `dtype` when one is given (converted as it is written), else in the first batch's dtype."""

    def __init__(self, capacity: int, device: str | torch.device = "cpu", dtype: torch.dtype | None = None):
        if capacity <= 0:
            raise ValueError(f"replay capacity must be positive, got {capacity}")
        self.capacity = int(capacity)
        self.device = torch.device(device)
        self.dtype = dtype
        self.fields: dict[str, torch.Tensor] = {}
        self._host: dict[str, np.ndarray] = {}
        self.cursor = 0  # next write position
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def _allocate(self, batch: dict[str, np.ndarray | torch.Tensor]) -> None:
        for name, value in batch.items():
            dtype = self.dtype or _torch_dtype(value)
            self.fields[name] = torch.zeros((self.capacity, *value.shape[1:]), dtype=dtype, device=self.device)
        self._host = self._host_views()

    def extend(self, batch: dict[str, np.ndarray | torch.Tensor]) -> None:
        """Append n rows (every field has leading dim n); the oldest rows are overwritten when full."""
        if not self.fields:
            self._allocate(batch)
        n = len(next(iter(batch.values())))
        if n > self.capacity:  # only the newest `capacity` rows can survive
            batch = {k: v[-self.capacity:] for k, v in batch.items()}
            n = self.capacity
        sources = self._sources(batch, n)
        for start, stop, offset in self._ring_slices(n):
            for name, source in sources.items():
                rows = source[offset:offset + stop - start]
                if isinstance(rows, np.ndarray):  # CPU storage: convert and copy in one pass, into the ring
                    np.copyto(self._host[name][start:stop], rows.reshape(self._host[name][start:stop].shape),
                              casting="unsafe")
                else:
                    field = self.fields[name]
                    field[start:stop].copy_(rows.reshape(stop - start, *field.shape[1:]), non_blocking=True)
        self.cursor = (self.cursor + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def _ring_slices(self, n: int) -> list[tuple[int, int, int]]:
        """(start, stop, offset in the batch) of the one or two contiguous ring regions n rows land in."""
        first = min(n, self.capacity - self.cursor)
        slices = [(self.cursor, self.cursor + first, 0)]
        if first < n:
            slices.append((0, n - first, first))
        return slices

    def _sources(self, batch: dict, n: int) -> dict[str, np.ndarray | torch.Tensor]:
        """Where each field's rows are copied from: host arrays for a CPU storage; on CUDA, device tensors."""
        if self.device.type == "cpu":
            return {name: np.asarray(value) for name, value in batch.items()}
        if any(isinstance(v, torch.Tensor) and v.device.type != "cpu" for v in batch.values()) or \
                len({field.dtype for field in self.fields.values()}) != 1:  # one packed buffer needs one dtype
            return {name: torch.as_tensor(value).to(self.device, non_blocking=True) for name, value in batch.items()}
        return self._staged(batch, n)

    def _staged(self, batch: dict, n: int) -> dict[str, torch.Tensor]:
        """The host fields packed side by side into one pinned buffer (converted as they are copied in) and sent
        to the device in one asynchronous copy; returns views of the device copy, one per field. Pinned: from
        pageable memory the driver would first copy through a buffer of its own and the copy would not overlap.
        The caching host allocator keeps the block until the copy has read it, so it is not reused too soon."""
        widths = [int(np.prod(self.fields[name].shape[1:], dtype=np.int64)) for name in batch]
        dtype = next(iter(self.fields.values())).dtype
        staging = torch.empty((n, sum(widths)), dtype=dtype, pin_memory=True)
        host, column = staging.numpy(), 0
        for (name, value), width in zip(batch.items(), widths):
            np.copyto(host[:, column:column + width], np.asarray(value).reshape(n, width), casting="unsafe")
            column += width
        packed = staging.to(self.device, non_blocking=True)
        views, column = {}, 0
        for name, width in zip(batch, widths):
            views[name] = packed[:, column:column + width]
            column += width
        return views

    def gather(self, index: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: field[index] for name, field in self.fields.items()}

    def state_dict(self) -> dict:
        # Only the filled rows, copied to CPU memory (a copy on CPU too: the ring keeps being written after).
        return {"capacity": self.capacity, "cursor": self.cursor, "size": self.size,
                "fields": {k: v[: self.size].to("cpu", copy=True) for k, v in self.fields.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.capacity, self.cursor, self.size = int(state["capacity"]), int(state["cursor"]), int(state["size"])
        self.fields = {}
        for name, rows in state["fields"].items():
            field = torch.zeros((self.capacity, *rows.shape[1:]), dtype=self.dtype or rows.dtype, device=self.device)
            field[: rows.shape[0]] = rows.to(self.device)
            self.fields[name] = field
        self._host = self._host_views()

    def _host_views(self) -> dict[str, np.ndarray]:
        """Writable numpy views of a CPU ring: a batch is converted and copied into them in one pass."""
        return {name: field.numpy() for name, field in self.fields.items()} if self.device.type == "cpu" else {}


def _torch_dtype(value: np.ndarray | torch.Tensor) -> torch.dtype:
    if isinstance(value, torch.Tensor):
        return value.dtype
    return torch.from_numpy(np.empty(0, np.asarray(value).dtype)).dtype

"""How a state dict is laid out in flat byte buckets for a collective: tensors grouped by dtype, in the
sender's order, packed back to back up to `bucket_bytes` per bucket (a larger tensor gets a bucket of its own).
The layout is computed once by the sender and read by the receivers; every sync then moves raw bytes."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Slot:
    name: str
    shape: tuple[int, ...]
    offset: int  # in elements of the bucket's dtype
    numel: int


@dataclass(frozen=True)
class Bucket:
    dtype: str  # torch dtype name, e.g. "bfloat16" (picklable and readable)
    slots: tuple[Slot, ...]

    @property
    def numel(self) -> int:
        return sum(slot.numel for slot in self.slots)

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.torch_dtype).element_size()

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def views(self, flat_bytes: torch.Tensor) -> list[torch.Tensor]:
        """Each slot's tensor as a view into a uint8 buffer holding this bucket."""
        flat = flat_bytes[:self.nbytes].view(self.torch_dtype)
        return [flat[slot.offset:slot.offset + slot.numel].view(slot.shape) for slot in self.slots]


@dataclass(frozen=True)
class Layout:
    buckets: tuple[Bucket, ...]

    @property
    def names(self) -> list[str]:
        return [slot.name for bucket in self.buckets for slot in bucket.slots]

    @property
    def nbytes(self) -> int:
        return sum(bucket.nbytes for bucket in self.buckets)

    @property
    def largest_bucket_bytes(self) -> int:
        return max((bucket.nbytes for bucket in self.buckets), default=0)

    def check(self, state: Mapping[str, torch.Tensor]) -> None:
        """The state must have exactly the layout's tensors, with their shapes and dtypes."""
        missing, extra = set(self.names) - set(state), set(state) - set(self.names)
        if missing or extra:
            raise KeyError(f"state does not match the sync layout: missing {sorted(missing)[:3]}, "
                           f"extra {sorted(extra)[:3]}")
        for bucket in self.buckets:
            for slot in bucket.slots:
                tensor = state[slot.name]
                if tuple(tensor.shape) != slot.shape or tensor.dtype != bucket.torch_dtype:
                    raise ValueError(f"{slot.name}: {tuple(tensor.shape)} {tensor.dtype} does not match the sync "
                                     f"layout's {slot.shape} {bucket.torch_dtype}")


def plan_layout(state: Mapping[str, torch.Tensor], bucket_bytes: int) -> Layout:
    """Buckets of at most `bucket_bytes` (one dtype each) holding every tensor of `state`."""
    by_dtype: dict[torch.dtype, list[tuple[str, torch.Tensor]]] = {}
    for name, tensor in state.items():
        by_dtype.setdefault(tensor.dtype, []).append((name, tensor))
    buckets: list[Bucket] = []
    for dtype, tensors in by_dtype.items():
        element = torch.empty((), dtype=dtype).element_size()
        slots: list[Slot] = []
        offset = 0
        for name, tensor in tensors:
            if slots and (offset + tensor.numel()) * element > bucket_bytes:
                buckets.append(Bucket(str(dtype).removeprefix("torch."), tuple(slots)))
                slots, offset = [], 0
            slots.append(Slot(name, tuple(tensor.shape), offset, tensor.numel()))
            offset += tensor.numel()
        if slots:
            buckets.append(Bucket(str(dtype).removeprefix("torch."), tuple(slots)))
    return Layout(tuple(buckets))

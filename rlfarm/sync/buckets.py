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


def plan_layout(state: Mapping[str, torch.Tensor], bucket_bytes: int, edge_bytes: int | None = None) -> Layout:
    """Buckets of at most `bucket_bytes` (one dtype each) holding every tensor of `state`.

    edge_bytes: cap the first and the last bucket of each dtype at this size, filled with small tensors taken
    out of order. A pipelined transfer cannot hide packing the first bucket (nothing is on the wire yet) nor
    unpacking the last (nothing is left to send): small edge buckets shorten both ends, while the large
    middle buckets keep the per-bucket launch costs few. None: buckets in the state's order."""
    by_dtype: dict[torch.dtype, list[tuple[str, torch.Tensor]]] = {}
    for name, tensor in state.items():
        by_dtype.setdefault(tensor.dtype, []).append((name, tensor))
    buckets: list[Bucket] = []
    for dtype, tensors in by_dtype.items():
        dtype_name = str(dtype).removeprefix("torch.")
        element = torch.empty((), dtype=dtype).element_size()
        if edge_bytes is None:
            groups = _fill(tensors, bucket_bytes, element)
        else:
            head, rest = _pick(tensors, edge_bytes, element)
            tail, middle = _pick(rest[::-1], edge_bytes, element)
            groups = [group for group in (head, *_fill(middle[::-1], bucket_bytes, element), tail[::-1]) if group]
        buckets.extend(Bucket(dtype_name, _slots(group)) for group in groups)
    return Layout(tuple(buckets))


def _fill(tensors: list, bucket_bytes: int, element: int) -> list[list]:
    """Consecutive runs of tensors of at most `bucket_bytes` each (a larger tensor alone)."""
    groups: list[list] = [[]]
    size = 0
    for name, tensor in tensors:
        if groups[-1] and (size + tensor.numel()) * element > bucket_bytes:
            groups.append([])
            size = 0
        groups[-1].append((name, tensor))
        size += tensor.numel()
    return [g for g in groups if g]


def _pick(tensors: list, limit_bytes: int, element: int) -> tuple[list, list]:
    """(the tensors, in order, that fit together within `limit_bytes`, skipping larger ones; the others)."""
    picked, others, size = [], [], 0
    for name, tensor in tensors:
        if (size + tensor.numel()) * element <= limit_bytes:
            picked.append((name, tensor))
            size += tensor.numel()
        else:
            others.append((name, tensor))
    return picked, others


def _slots(group: list) -> tuple[Slot, ...]:
    slots, offset = [], 0
    for name, tensor in group:
        slots.append(Slot(name, tuple(tensor.shape), offset, tensor.numel()))
        offset += tensor.numel()
    return tuple(slots)

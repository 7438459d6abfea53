"""Getting a labeler's bus onto the device without stalling it: sub-batches cut across the bus's chunks without a
copy (`sub_batches`), and `StagedUpload`, which copies each sub-batch once on the host, into one of two pinned
staging buffers, and up to the device on a stream of its own.

Why a stream of its own: on the compute stream, the copy of the next bus's second sub-batch would wait for the last
bus's first forward pass, and with it the host that wants to refill that buffer. Why two buffers: the host fills
one while the other's copy is still under way. A reward model that calls this for every sub-batch of a call and
reads the result with `OnDevice` (rlfarm/rewards/base.py) never blocks the labeler, which then gathers its next
bus while the device works on this one."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext

import numpy as np
import torch


def sub_batches(parts: list[np.ndarray], size: int) -> Iterator[list[np.ndarray]]:
    """Consecutive runs of at most `size` rows across a list of arrays, each a list of views (nothing copied)."""
    pieces, held = [], 0
    for part in parts:
        start = 0
        while start < len(part):
            take = min(size - held, len(part) - start)
            pieces.append(part[start : start + take])
            held, start = held + take, start + take
            if held == size:
                yield pieces
                pieces, held = [], 0
    if pieces:
        yield pieces


def as_parts(array_or_parts) -> list[np.ndarray]:
    """A batch value as a list of arrays: a labeler hands over its chunks' arrays (`RewardModel.takes_parts`), a
    direct caller one array."""
    return list(array_or_parts) if isinstance(array_or_parts, (list, tuple)) else [array_or_parts]


class StagedUpload:
    """Sub-batches of at most `max_rows` rows onto `device`: on CUDA through pinned staging buffers (two per name)
    and a copy stream; elsewhere a plain tensor of the rows.

    stages: the labeler's StageClock (`RewardModel.stages`), or None: the host's copy into staging is timed as
    "upload" and the wait for a staging buffer's previous copy as "upload_wait", inside the labeler's "launch", so a
    run's metrics say which part of starting a call the host spends its time on."""

    def __init__(self, device: torch.device, max_rows: int, stages=None):
        self.device, self.max_rows = device, max_rows
        self._timing = stages.timing if stages is not None else (lambda name: nullcontext())
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._buffers: dict[tuple[str, int], tuple[torch.Tensor, torch.cuda.Event]] = {}

    def __call__(self, pieces: list[np.ndarray], name: str, slot: int) -> torch.Tensor:
        """The rows of `pieces` (consecutive, at most max_rows) as one tensor on the device. `slot` alternates
        between a call's sub-batches (0, 1, 0, ...) so that one buffer is filled while the other is copied."""
        if self._stream is None:  # a copy even of one piece: a chunk from the object store is read-only
            with self._timing("upload"):
                return torch.from_numpy(np.concatenate(pieces)).to(self.device)
        staging, copied = self._staging(name, slot, pieces[0])
        with self._timing("upload_wait"):
            copied.synchronize()  # this buffer's previous copy (two sub-batches ago) has left it
        view = staging[: sum(len(piece) for piece in pieces)]
        filled = 0
        with self._timing("upload"):
            for piece in pieces:
                np.copyto(view[filled : filled + len(piece)].numpy(), piece)
                filled += len(piece)
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self._stream):
            on_device = view.to(self.device, non_blocking=True)
            copied.record(self._stream)
        compute.wait_event(copied)
        on_device.record_stream(compute)  # its memory is not handed out again before the compute stream has read it
        return on_device

    def _staging(self, name: str, slot: int, like: np.ndarray) -> tuple[torch.Tensor, torch.cuda.Event]:
        """The pinned buffer of (name, slot) for rows like `like`'s, and the event of its last copy."""
        staging, event = self._buffers.get((name, slot), (None, None))
        dtype = torch.from_numpy(np.empty(0, like.dtype)).dtype  # (like itself may have negative strides)
        if staging is None or staging.shape[1:] != like.shape[1:] or staging.dtype != dtype:
            if event is not None:
                event.synchronize()
            staging = torch.empty((self.max_rows, *like.shape[1:]), dtype=dtype).pin_memory()
            event = torch.cuda.Event()
            event.record()
            self._buffers[(name, slot)] = (staging, event)
        return staging, event

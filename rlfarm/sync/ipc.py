"""Weight sync between two processes that share one GPU (colocated learner and engine): CUDA IPC.

The learner packs its tensors into one GPU buffer per dtype, allocated once for the run, and hands the engine
the buffers' IPC handles (a few hundred bytes, pickled through Ray). The engine maps them once and copies
straight into its weights. Per sync: one device copy on each side; the weights never touch the host and
nothing is serialized, where the object store copies the whole state to host memory and back
(docs/benchmarks.md compares the two on the 0.5B shape).

The mapped memory belongs to the learner's process: the engine only reads it during `receive`, which ends
with the engine's copies done, and the learner packs the next sync only after that call returned.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
from torch.multiprocessing.reductions import reduce_tensor

from rlfarm.sync.base import WeightReceiver, WeightSender
from rlfarm.sync.buckets import Layout, plan_layout

# Index of the device ordinal among the arguments `reduce_tensor` returns for a CUDA tensor (torch's
# `rebuild_cuda_tensor` signature). The sender's ordinal is its own view of the GPU; the receiver puts its own.
_DEVICE_ARG = 6
ONE_BUCKET_PER_DTYPE = 1 << 62


@dataclass(frozen=True)
class IpcPayload:
    layout: Layout
    handles: tuple  # per bucket: (rebuild function, its arguments) from torch's CUDA tensor reduction
    gpu_uuid: str   # the GPU the buffers live on: the receiver must be on the same one


def gpu_uuid(device: torch.device | str) -> str:
    return str(torch.cuda.get_device_properties(torch.device(device)).uuid)


class IpcSender(WeightSender):
    """The learner's side: a buffer per dtype on its GPU, shared once; every `send` packs the state into it."""

    def __init__(self, state: Mapping[str, torch.Tensor], device: torch.device | str):
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"CUDA IPC weight sync needs a GPU, not {self.device}")
        self.layout = plan_layout(state, ONE_BUCKET_PER_DTYPE)
        self.buffers = [torch.empty(bucket.nbytes, dtype=torch.uint8, device=self.device)
                        for bucket in self.layout.buckets]
        self.payload = IpcPayload(self.layout, tuple(reduce_tensor(buffer) for buffer in self.buffers),
                                  gpu_uuid(self.device))

    @torch.no_grad()
    def send(self, state: Mapping[str, torch.Tensor]) -> IpcPayload:
        self.layout.check(state)
        for bucket, buffer in zip(self.layout.buckets, self.buffers):
            torch._foreach_copy_(bucket.views(buffer), [state[slot.name] for slot in bucket.slots])
        # Another process reads the buffers, on a stream that knows nothing of ours: the copies must have landed.
        torch.cuda.synchronize(self.device)
        return self.payload

    def views(self) -> dict[str, torch.Tensor]:
        """name → its slot in the shared buffers: a tensor written there is already packed (`send` then copies
        each slot onto itself). An FSDP learner gathers into them (`rlfarm.roles.gathered_weights`)."""
        return {slot.name: view for bucket, buffer in zip(self.layout.buckets, self.buffers)
                for slot, view in zip(bucket.slots, bucket.views(buffer))}


class IpcReceiver(WeightReceiver):
    """The engine's side: maps the sender's buffers on first use and yields views of them per dtype."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self._mapped: tuple[IpcPayload, list[torch.Tensor]] | None = None

    def receive(self, sent: IpcPayload) -> Iterator[dict[str, torch.Tensor]]:
        """The caller copies out of each part; once every part is consumed, those copies are done."""
        buffers = self._map(sent)
        for bucket, buffer in zip(sent.layout.buckets, buffers):
            yield {slot.name: view for slot, view in zip(bucket.slots, bucket.views(buffer))}
        torch.cuda.synchronize(self.device)  # the learner may repack as soon as this sync returns

    def _map(self, sent: IpcPayload) -> list[torch.Tensor]:
        if self._mapped is not None and self._mapped[0] == sent:
            return self._mapped[1]
        if self.device.type != "cuda" or gpu_uuid(self.device) != sent.gpu_uuid:
            raise RuntimeError(f"CUDA IPC weight sync needs the engine on the learner's GPU ({sent.gpu_uuid}); "
                               f"this engine is on {self.device}: use algo.weight_sync=broadcast or object_store")
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        buffers = []
        for rebuild, args in sent.handles:
            args = list(args)
            args[_DEVICE_ARG] = index
            buffers.append(rebuild(*args))
        self._mapped = (sent, buffers)
        return buffers

"""The one place a weight-sync transport is chosen by name: `pick_transport` turns `algo.weight_sync` into a
transport at start, and `open_sender` / `open_receiver` build each side's end of it once. After that the
learner only calls `WeightSender.send` and the engine `WeightReceiver.receive`, whatever the transport."""
from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist

from rlfarm.errors import ConfigError
from rlfarm.sync.base import WeightReceiver, WeightSender
from rlfarm.sync.broadcast import BroadcastReceiver, BroadcastSender, join_group, serve_rendezvous_on_node
from rlfarm.sync.buckets import plan_layout
from rlfarm.sync.ipc import IpcReceiver, IpcSender
from rlfarm.sync.object_store import ObjectStoreReceiver, ObjectStoreSender

TRANSPORTS = ("object_store", "broadcast", "ipc")
SYNC_BUCKET_BYTES = 256 * 2**20  # broadcast bucket size: the fastest of those measured (docs/benchmarks.md, P5)


def pick_transport(choice: str, on_gpus: bool, time_share: bool) -> str:
    """The transport for `algo.weight_sync` (auto | object_store | broadcast | ipc). on_gpus: learner and engine
    both hold a GPU; time_share: they share one. auto: CUDA IPC on one shared GPU (roles on one GPU map each
    other's memory), NCCL broadcast between GPUs (NCCL needs one GPU per rank), the object store on CPU."""
    if choice == "auto":
        return ("ipc" if time_share else "broadcast") if on_gpus else "object_store"
    if choice not in TRANSPORTS:
        raise ConfigError(f"algo.weight_sync must be one of auto|{'|'.join(TRANSPORTS)}, not {choice!r}")
    if choice == "ipc" and not (on_gpus and time_share):
        raise ConfigError("algo.weight_sync=ipc needs the learner and the engine on one GPU",
                          "use a colocated GPU topology, or algo.weight_sync=auto")
    return choice


def uses_group(transport: str) -> bool:
    """The transport moves the bytes over a process group that the learner (rank 0) serves the rendezvous of
    and that every side joins at the same time (`open_sender` and `open_receiver` run concurrently)."""
    return transport == "broadcast"


def open_sender(transport: str, state: Mapping[str, torch.Tensor], device: torch.device | str,
                rendezvous: dist.TCPStore | None = None, world_size: int = 2) -> WeightSender:
    """The learner's end, built once. `state`: what each send will carry (the IPC buffers and the broadcast
    layout are sized by it). rendezvous: rank 0's store from `serve_rendezvous`, when `uses_group`."""
    if transport == "broadcast":
        return BroadcastSender(join_group(rendezvous, 0, world_size, device), plan_layout(state, SYNC_BUCKET_BYTES))
    if transport == "ipc":
        return IpcSender(state, device)
    return ObjectStoreSender()  # CPU copies, put once; the engines fetch the boxed ref


def open_receiver(transport: str, device: torch.device | str, address: str | None = None, rank: int = 1,
                  world_size: int = 2) -> WeightReceiver:
    """An engine's end, built once. address: the group's rendezvous "host:port", when `uses_group`."""
    if transport == "broadcast":
        return BroadcastReceiver(join_group(address, rank, world_size, device))
    if transport == "ipc":
        return IpcReceiver(device)
    return ObjectStoreReceiver()


class SenderSetup:
    """The learner's half of the set-up handshake, the one builder of a sync's sending end:
        setup = SenderSetup(transport, receivers)   # serves the group's rendezvous when the transport has one
        → every receiver's `open_receiver(transport, device, setup.address, rank, world_size)`, at the same time as
        → `sender = setup.open(state, device)`      # a broadcast: all members join the group together
    `address` is what the receivers join (None when the transport needs no group)."""

    def __init__(self, transport: str, receivers: int = 1):
        self.transport, self.world_size = transport, 1 + int(receivers)
        self.rendezvous, self.address = (serve_rendezvous_on_node(self.world_size) if uses_group(transport)
                                         else (None, None))

    def open(self, state: Mapping[str, torch.Tensor], device: torch.device | str) -> WeightSender:
        return open_sender(self.transport, state, device, self.rendezvous, self.world_size)

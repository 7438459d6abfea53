"""Weight sync by broadcast over a process group of the learner (rank 0) and its engines (ranks 1..N):
NCCL between GPUs (the tensors never touch the host), gloo between CPU processes.

The group is a torch.distributed backend on a TCPStore of its own, not the default process group, so a
learner that also runs DDP, or an engine with a group of its own, is not disturbed. The sender puts the
`Layout` in that store once; every sync then broadcasts the raw bytes of a few flat buckets.

Pipelining: two byte buffers the size of the largest bucket on each side. The sender packs bucket i + 1
while bucket i is on the wire; a receiver posts the receive of bucket i + 2 as soon as its caller has
queued the copies out of bucket i. With NCCL every wait is a CUDA stream wait, so neither host blocks, and
the collective of a buffer is ordered after the copies queued before it on the current stream.
"""
from __future__ import annotations

import datetime
import pickle
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from rlfarm.sync.base import WeightReceiver, WeightSender
from rlfarm.sync.buckets import Layout

LAYOUT_KEY = "rlfarm/sync/layout"


@dataclass
class SyncGroup:
    """One member of a sync group: its rank, the backend that moves the bytes, and the shared store."""

    backend: object
    store: dist.Store
    rank: int
    world_size: int
    device: torch.device

    def broadcast(self, tensor: torch.Tensor, root: int = 0):
        return self.backend.broadcast(tensor, root)

    def close(self) -> None:
        shutdown = getattr(self.backend, "shutdown", None)
        if shutdown is not None:
            shutdown()


def serve_rendezvous(world_size: int, host: str = "127.0.0.1", timeout_s: float = 300) -> dist.TCPStore:
    """Rank 0's store on a free port; the others join it at f"{host}:{store.port}"."""
    return dist.TCPStore(host, 0, world_size, is_master=True, timeout=datetime.timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def serve_rendezvous_on_node(world_size: int) -> tuple[dist.TCPStore, str]:
    """`serve_rendezvous` on this Ray node's address (loopback outside Ray): (the store, the "host:port" to join)."""
    import ray

    host = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
    store = serve_rendezvous(world_size, host=host)
    return store, f"{host}:{store.port}"


def join_group(rendezvous: dist.TCPStore | str, rank: int, world_size: int, device: torch.device | str,
               timeout_s: float = 300) -> SyncGroup:
    """Join the group (every member calls this at the same time): rank 0 passes the store from
    `serve_rendezvous`, the others its "host:port". NCCL when `device` is a GPU, gloo on CPU. A one-element
    broadcast ends the call, so the group is connected (and NCCL's communicator built) when it returns."""
    device = torch.device(device)
    timeout = datetime.timedelta(seconds=timeout_s)
    if isinstance(rendezvous, str):
        host, port = rendezvous.rsplit(":", 1)
        store = dist.TCPStore(host, int(port), world_size, is_master=False, timeout=timeout)
    else:
        store = rendezvous
    store = dist.PrefixStore("rlfarm-sync/", store)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        backend = dist.ProcessGroupNCCL(store, rank, world_size, options)
    else:
        backend = dist.ProcessGroupGloo(store, rank, world_size, timeout)
    group = SyncGroup(backend, store, rank, world_size, device)
    group.broadcast(torch.zeros(1, device=device)).wait()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return group


class BroadcastSender(WeightSender):
    """Rank 0: packs the state into buckets and broadcasts them. The state must match `layout` at every send."""

    def __init__(self, group: SyncGroup, layout: Layout, buffers: int = 2):
        if group.rank != 0:
            raise ValueError(f"the sender is rank 0 of its sync group, not rank {group.rank}")
        self.group, self.layout = group, layout
        self.buffers = [torch.empty(layout.largest_bucket_bytes, dtype=torch.uint8, device=group.device)
                        for _ in range(buffers)]
        group.store.set(LAYOUT_KEY, pickle.dumps(layout))

    @torch.no_grad()
    def send(self, state: Mapping[str, torch.Tensor]) -> None:
        self.layout.check(state)
        in_flight: list = [None] * len(self.buffers)
        for i, bucket in enumerate(self.layout.buckets):
            k = i % len(self.buffers)
            if in_flight[k] is not None:
                in_flight[k].wait()  # this buffer's last broadcast is done before we pack into it again
            torch._foreach_copy_(bucket.views(self.buffers[k]), [state[slot.name] for slot in bucket.slots])
            in_flight[k] = self.group.broadcast(self.buffers[k][:bucket.nbytes])
        for work in in_flight:
            if work is not None:
                work.wait()
        return None


class BroadcastReceiver(WeightReceiver):
    """Ranks 1..N: reads the layout the sender published, then yields each bucket's tensors as it arrives."""

    meets_sender = True

    def __init__(self, group: SyncGroup, buffers: int = 2):
        if group.rank == 0:
            raise ValueError("rank 0 of a sync group is the sender")
        self.group = group
        self.layout: Layout = pickle.loads(group.store.get(LAYOUT_KEY))  # waits until the sender has set it
        self.buffers = [torch.empty(self.layout.largest_bucket_bytes, dtype=torch.uint8, device=group.device)
                        for _ in range(buffers)]

    def receive(self, sent=None) -> Iterator[dict[str, torch.Tensor]]:
        """Every bucket must be consumed (the sender is broadcasting them all)."""
        buckets, count = self.layout.buckets, len(self.buffers)
        posted = {}

        def post(i: int) -> None:
            posted[i] = self.group.broadcast(self.buffers[i % count][:buckets[i].nbytes])

        for i in range(min(count, len(buckets))):
            post(i)
        for i, bucket in enumerate(buckets):
            posted.pop(i).wait()
            yield {slot.name: view for slot, view in zip(bucket.slots, bucket.views(self.buffers[i % count]))}
            if i + count < len(buckets):
                post(i + count)  # after the caller queued its copies out of this buffer

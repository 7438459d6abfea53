"""Weight sync: moving a learner's trainable tensors into the policy copies that act or generate with them.

Four transports behind one pair of interfaces (`rlfarm.sync.base`: `WeightSender` / `WeightReceiver`, a
publication is `(what the receivers read, version)`); `rlfarm.sync.transport` picks one by name, once at start,
and builds each side's end of it (`SenderSetup` on the learner, `open_receiver` on each engine):
- object store (`rlfarm.sync.object_store`): CPU copies that Ray stores once, each receiver fetching a version new
  to it (`HeldWeights`); what CPU roles and every env runner, rollout runner and VLA role use. A learner that must
  not stall its update stream publishes through `WeightPublisher` (`rlfarm.sync.publisher`);
- broadcast (`BroadcastSender` / `BroadcastReceiver`): a process group of the learner (rank 0) and its
  engines (NCCL on GPUs, gloo on CPU), the tensors packed into a few flat buckets, double-buffered so
  packing, sending and unpacking overlap;
- CUDA IPC (`IpcSender` / `IpcReceiver`): learner and engine in two processes on one GPU (colocated); the
  engine maps the learner's GPU buffers once and copies from them at every sync;
- in place (`InPlaceSender`): learner and engine in one process; the engine copies straight from the
  learner's tensors.
Under LoRA the learner publishes only the adapter tensors (`rlfarm.models.lm.trainable_state_dict`), so
only those move, whatever the transport. `sync/` imports no engine and no role: an engine loads what a receiver
yields through `rlfarm.engines.base.load_into`."""
from rlfarm.sync.base import PassThroughReceiver, Publication, WeightReceiver, WeightSender
from rlfarm.sync.broadcast import (BroadcastReceiver, BroadcastSender, SyncGroup, join_group, serve_rendezvous,
                                   serve_rendezvous_on_node)
from rlfarm.sync.buckets import Bucket, Layout, plan_layout
from rlfarm.sync.ipc import IpcPayload, IpcReceiver, IpcSender
from rlfarm.sync.local import HostSender, InPlaceSender
from rlfarm.sync.object_store import HeldWeights, ObjectStoreReceiver, ObjectStoreSender, publication
from rlfarm.sync.publisher import WeightPublisher
from rlfarm.sync.transport import SenderSetup, open_receiver, open_sender, pick_transport, uses_group

__all__ = ["WeightSender", "WeightReceiver", "Publication", "PassThroughReceiver", "HostSender", "InPlaceSender",
           "ObjectStoreSender", "ObjectStoreReceiver", "HeldWeights", "publication", "WeightPublisher",
           "BroadcastSender", "BroadcastReceiver", "SyncGroup", "join_group", "serve_rendezvous",
           "serve_rendezvous_on_node", "Bucket", "Layout", "plan_layout", "IpcPayload", "IpcSender", "IpcReceiver",
           "pick_transport", "uses_group", "open_sender", "open_receiver", "SenderSetup"]

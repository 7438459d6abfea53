"""Weight sync: moving a learner's trainable tensors into an engine's model.

Four transports behind one pair of interfaces (`rlfarm.sync.base`); `rlfarm.sync.transport` picks one by name,
once at start, and builds each side's end of it:
- object store (`HostSender`): CPU copies that Ray stores once (the learner call's result); what CPU roles use;
- broadcast (`BroadcastSender` / `BroadcastReceiver`): a process group of the learner (rank 0) and its
  engines (NCCL on GPUs, gloo on CPU), the tensors packed into a few flat buckets, double-buffered so
  packing, sending and unpacking overlap;
- CUDA IPC (`IpcSender` / `IpcReceiver`): learner and engine in two processes on one GPU (colocated); the
  engine maps the learner's GPU buffers once and copies from them at every sync;
- in place (`InPlaceSender`): learner and engine in one process; the engine copies straight from the
  learner's tensors.
Under LoRA the learner publishes only the adapter tensors (`rlfarm.models.lm.trainable_state_dict`), so
only those move, whatever the transport.
"""
from rlfarm.sync.base import PassThroughReceiver, WeightReceiver, WeightSender, load_into
from rlfarm.sync.broadcast import BroadcastReceiver, BroadcastSender, SyncGroup, join_group, serve_rendezvous
from rlfarm.sync.buckets import Bucket, Layout, plan_layout
from rlfarm.sync.ipc import IpcPayload, IpcReceiver, IpcSender
from rlfarm.sync.local import HostSender, InPlaceSender
from rlfarm.sync.transport import open_receiver, open_sender, pick_transport

__all__ = ["WeightSender", "WeightReceiver", "PassThroughReceiver", "load_into", "HostSender", "InPlaceSender",
           "BroadcastSender", "BroadcastReceiver", "SyncGroup", "join_group", "serve_rendezvous", "Bucket",
           "Layout", "plan_layout", "IpcPayload", "IpcSender", "IpcReceiver", "pick_transport", "open_sender",
           "open_receiver"]

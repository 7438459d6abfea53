"""Helpers shared by role actors: device choice from what Ray assigned, thread limits, seeding, a process group's
rendezvous."""
from __future__ import annotations

import os
import random

import numpy as np
import torch

from rlfarm.checkpoint_files import write_checkpoint


def assigned_device() -> str:
    """cuda:0 when Ray gave this actor a GPU and CUDA is usable, else cpu (declared GPUs on a CPU machine)."""
    import ray

    if not ray.is_initialized():  # a role built in-process (tests, benches): ray.get_gpu_ids() would start Ray
        return "cpu"
    if ray.get_gpu_ids() and torch.cuda.is_available():
        return "cuda:0"  # Ray sets CUDA_VISIBLE_DEVICES to the assigned GPUs
    return "cpu"


def limit_threads(threads: int) -> None:
    torch.set_num_threads(max(1, int(threads)))
    os.environ["OMP_NUM_THREADS"] = str(max(1, int(threads)))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def save_atomic(state: dict, path: str) -> str:
    """A checkpoint, whole or not at all, with its sha256 sidecar that resume and eval verify
    (rlfarm/checkpoint_files.py)."""
    return write_checkpoint(state, path)


def serve_rendezvous_here(world_size: int):
    """A process group's rendezvous store served by this actor on a free port, and the "host:port" the other members
    join (`rlfarm.sync.serve_rendezvous_on_node`: the one place a rendezvous is served on this node's address)."""
    from rlfarm.sync import serve_rendezvous_on_node

    return serve_rendezvous_on_node(world_size)


def release_cached_memory() -> None:
    """Hand the CUDA caching allocator's free blocks back to the card (a no-op without CUDA): a role that time-shares
    its GPU (a colocated learner after its update) leaves the room to the next one (the engine, waking)."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()

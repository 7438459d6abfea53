"""What an FSDP learner publishes: the whole trainable tensors, gathered from the ranks' shards after each update.

Gathering is a collective (every rank calls `gather`, in the same order); only rank 0 keeps the result, in the
engines' dtype, for its next `publish`. Rank 0 gathers into the tensors it already holds (in place), so a 7B policy
costs one copy of its bf16 weights (15 GB), not two while the next version replaces the last. Under CUDA IPC the
sender packs into shared buffers of its own: `adopt` makes those buffers the gathered tensors, and the copy the
sender would make is the same memory (one 15 GB copy on rank 0's GPU instead of two).
"""
from __future__ import annotations

import torch
from torch import nn

from rlfarm.data_parallel import full_tensors
from rlfarm.models.lm import trainable_state_dict
from rlfarm.sync.base import WeightSender


class GatheredWeights:
    def __init__(self, rank: int, dtype: torch.dtype):
        self.rank, self.dtype = rank, dtype
        self.tensors: dict[str, torch.Tensor] = {}  # rank 0: name → whole tensor; other ranks: empty

    def gather(self, model: nn.Module) -> None:
        """Every rank at once: all-gather the trainable shards, one tensor at a time (a rank holds one extra whole
        tensor at most); rank 0 writes each into the tensor it holds under that name, or keeps a new one."""
        for name, shard in trainable_state_dict(model).items():
            whole = full_tensors({name: shard})[name]
            if self.rank != 0:
                continue
            if name in self.tensors:
                self.tensors[name].copy_(whole)
            else:
                self.tensors[name] = whole.to(self.dtype)

    def adopt(self, sender: WeightSender) -> None:
        """Rank 0, once the sender is built: where it packs into buffers of its own (`views`), fill them with the
        current tensors and gather into them from now on."""
        views = getattr(sender, "views", None)
        if views is None or not self.tensors:
            return
        sender.send(self.tensors)
        self.tensors = views()

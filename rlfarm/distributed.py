"""Data-parallel training of one policy over N processes (torch.distributed, DDP), without Ray.

Every rank holds the whole model wrapped in DDP and receives the whole scored batch; in each minibatch it
trains on its shard of the rows, DDP averages the gradients over the ranks during backward, and every rank
clips and steps the same averaged gradient, so the weights stay equal on all ranks.

Normalization. The GRPO loss is a token mean over the minibatch (DAPO: every valid token weighs the same).
Shards hold different numbers of tokens, so a per-shard token mean averaged over ranks would weigh a token of
a short shard more. Instead each rank divides its token sum by the token count of the whole minibatch
(`grpo_loss(num_tokens=...)`) and multiplies by N, which DDP's average divides out again:

    (1/N) Σ_r ∇(N · Σ_{t ∈ shard r} ℓ_t / T) = ∇(Σ_t ℓ_t / T)   — the single learner's gradient.

Shards are equal in size (the last ones padded with zero-weight rows), split by sequence: the advantages are
computed over whole groups before sharding, so the loss needs no group on one rank. The update itself is
`rlfarm.algos.grpo_trainer.update_policy(..., rank=, world_size=)`.
"""
from __future__ import annotations

import datetime
import torch
import torch.distributed as dist
from torch import nn



def join_data_parallel(rendezvous: dist.Store | str, rank: int, world_size: int, device: torch.device | str,
                       timeout_s: float = 300) -> None:
    """Make this process rank `rank` of the default process group (every rank calls this at once): rank 0
    passes the store it serves (`rlfarm.sync.serve_rendezvous`), the others its "host:port". NCCL on a GPU,
    gloo on CPU. Weight-sync groups (`rlfarm.sync.join_group`) are separate groups and do not disturb it."""
    device = torch.device(device)
    timeout = datetime.timedelta(seconds=timeout_s)
    if isinstance(rendezvous, str):
        host, port = rendezvous.rsplit(":", 1)
        rendezvous = dist.TCPStore(host, int(port), world_size, is_master=False, timeout=timeout)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            store=dist.PrefixStore("rlfarm-dp/", rendezvous), rank=rank, world_size=world_size,
                            timeout=timeout, **({"device_id": device} if device.type == "cuda" else {}))


def wrap_data_parallel(model: nn.Module, device: torch.device | str) -> nn.Module:
    """DDP over the default group. Buffers are not re-broadcast each forward: the models' buffers (rotary
    frequencies) are built the same on every rank and never change."""
    device = torch.device(device)
    return nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None,
                                               broadcast_buffers=False)


def shard_rows(rows: torch.Tensor, rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of `rows` (indices of one minibatch) and a weight per row (1 real, 0 padding).

    Contiguous shares of ceil(n / N) rows; a short share is padded with copies of rows[0] weighted 0, so
    every rank runs the same batch shape and a rank with no real rows still joins DDP's all-reduce.
    Returns (indices [ceil(n / N)], weights [ceil(n / N)] float32)."""
    size = -(-len(rows) // world_size)
    mine = rows[rank * size:(rank + 1) * size]
    weights = torch.zeros(size, device=rows.device)
    weights[:len(mine)] = 1.0
    return torch.cat([mine, rows[:1].expand(size - len(mine))]), weights

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
computed over whole groups before sharding, so the loss needs no group on one rank.
"""
from __future__ import annotations

import datetime
import torch
import torch.distributed as dist
from torch import nn

from rlfarm.algos.grpo import grpo_loss
from rlfarm.algos.grpo_trainer import GRPOConfig
from rlfarm.algos.ppo import approx_kl, clip_fraction
from rlfarm.engines.base import Rollout
from rlfarm.models.lm import sequence_logprobs


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


def data_parallel_update(ddp_model: nn.Module, optimizer: torch.optim.Optimizer, rollout: Rollout,
                         advantages: torch.Tensor, cfg: GRPOConfig, rank: int, world_size: int,
                         ref_model: nn.Module | None = None, compute_dtype: torch.dtype = torch.float32
                         ) -> dict[str, float]:
    """`rlfarm.algos.grpo_trainer.update_policy` on N ranks: the same minibatches (rank 0's permutation, sent
    to all) and the same steps, each rank computing the loss on its shard. Every rank returns the metrics of
    the whole batch (token means over all shards; grad_norm is the averaged gradient's). compute_dtype other
    than float32: the forward passes run under autocast to it (weights, gradients and optimizer stay fp32)."""
    device = next(ddp_model.parameters()).device
    module = ddp_model.module
    input_ids, attention_mask = rollout.input_ids().to(device), rollout.attention_mask().to(device)
    response_mask, old_logprobs = rollout.response_mask.to(device), rollout.logprobs.to(device)
    advantages, response_start = advantages.to(device), rollout.prompt_ids.shape[1]
    order = torch.randperm(len(input_ids), device=device)
    dist.broadcast(order, src=0)  # one permutation for all ranks, whatever their generators hold
    ddp_model.train()
    totals = {"loss": 0.0, "clip_fraction": 0.0, "approx_kl": 0.0, "grad_norm": 0.0}
    for rows in order.chunk(cfg.minibatches):
        num_tokens = response_mask[rows].sum().float()  # the whole minibatch's: the loss's denominator
        mine, weights = shard_rows(rows, rank, world_size)
        mask = response_mask[mine] * weights.unsqueeze(1)
        with torch.autocast(device.type, dtype=compute_dtype, enabled=compute_dtype != torch.float32):
            logprobs = sequence_logprobs(ddp_model, input_ids[mine], attention_mask[mine], response_start,
                                         rollout.temperature)
            ref_logprobs = None
            if cfg.kl_coef:
                with torch.no_grad():
                    ref_logprobs = sequence_logprobs(ref_model, input_ids[mine], attention_mask[mine],
                                                     response_start, rollout.temperature)
        loss = grpo_loss(logprobs, old_logprobs[mine], advantages[mine], mask, cfg.clip_low, cfg.clip_high,
                         ref_logprobs=ref_logprobs, kl_coef=cfg.kl_coef, num_tokens=num_tokens)
        optimizer.zero_grad(set_to_none=True)
        (loss * world_size).backward()  # DDP averages over the ranks: × N makes it the sum of the shards
        grad_norm = torch.nn.utils.clip_grad_norm_(module.parameters(), cfg.max_grad_norm)
        optimizer.step()
        with torch.no_grad():
            tokens = mask.sum()
            # token sums of this shard, summed over the ranks, then divided by the minibatch's token count
            sums = torch.stack([loss.detach().float() * num_tokens,
                                clip_fraction(logprobs, old_logprobs[mine], advantages[mine].unsqueeze(1), mask,
                                              cfg.clip_low, cfg.clip_high) * tokens,
                                approx_kl(logprobs, old_logprobs[mine], mask) * tokens])
            dist.all_reduce(sums)
            means = (sums / num_tokens.clamp(min=1.0)).tolist()
        for name, value in zip(("loss", "clip_fraction", "approx_kl", "grad_norm"), (*means, float(grad_norm))):
            totals[name] += value / cfg.minibatches
    ddp_model.eval()
    return totals

"""Data-parallel training of one policy over N processes (torch.distributed: DDP or FSDP2), without Ray.

Every rank receives the whole scored batch; in each minibatch it trains on its shard of the rows, the
gradients are averaged over the ranks during backward, and every rank steps the same averaged gradient.
- DDP (`wrap_data_parallel`): every rank holds the whole model, its gradients and its AdamW state.
- FSDP (`shard_model`, torch's `fully_shard`): each rank holds 1/N of the fp32 weights, gradients and AdamW
  state (4 + 4 + 8 bytes per parameter, what dominates a learner's memory); each decoder layer's weights are
  all-gathered for its forward/backward and freed after, gradients are reduce-scattered. `full_tensors` turns
  the shards back into whole tensors (a collective: every rank calls it) for weight sync and checkpoints.

Normalization. The GRPO loss is a token mean over the minibatch (DAPO: every valid token weighs the same).
Shards hold different numbers of tokens, so a per-shard token mean averaged over ranks would weigh a token of
a short shard more. Instead each rank divides its token sum by the token count of the whole minibatch
(`grpo_loss(num_tokens=...)`) and multiplies by N, which the ranks' average (DDP's all-reduce, FSDP's
reduce-scatter) divides out again:

    (1/N) Σ_r ∇(N · Σ_{t ∈ shard r} ℓ_t / T) = ∇(Σ_t ℓ_t / T)   — the single learner's gradient.

Shards are equal in size (the last ones padded with zero-weight rows), split by sequence: the advantages are
computed over whole groups before sharding, so the loss needs no group on one rank. The update itself is
`rlfarm.algos.grpo_lm.update_policy(..., rank=, world_size=)`.
"""
from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterator, Mapping

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


def shard_model(model: nn.Module, compute_dtype: torch.dtype = torch.float32) -> nn.Module:
    """FSDP2 over the default group, in place: each transformer block (the classes the model names in
    `_no_split_modules`, e.g. Qwen2DecoderLayer) is one unit — gathered for its own forward and backward only —
    and the root holds the rest (embeddings, final norm, head). Parameters become DTensor shards: build the
    optimizer after this. Frozen parameters (a LoRA base) are sharded too; only trainable ones get gradients.
    compute_dtype other than float32 (bf16 on GPUs): the shards stay fp32 (weights, gradients, AdamW), but a unit
    is gathered and computes in that dtype and gradients are reduced in fp32 (FSDP's mixed precision). Under
    autocast alone the fp32 gathered weights were cast per layer, and autocast kept every cast until the forward
    ended: a whole bf16 copy of the model (15 GB at 7B) on top of the shards, and twice the gather's bytes."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from rlfarm.models.lm import decoder_blocks

    precision = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32) \
        if compute_dtype != torch.float32 else MixedPrecisionPolicy()
    for block in decoder_blocks(model):
        if "forward" in vars(block):  # its compiled forward is bound to the class it has before `fully_shard`
            raise RuntimeError("compile the decoder blocks after shard_model (rlfarm.models.compiled)")
        fully_shard(block, mp_policy=precision)
    fully_shard(model, mp_policy=precision)
    return model


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Accumulate gradients locally (enabled=False) or meet the other ranks at the end of backward (True): DDP's
    `no_sync`; a plain module always accumulates locally. FSDP always meets them: every piece's gradients are
    reduce-scattered into the shards' (the sum is the same). Its local accumulation keeps the whole model's
    gradients unsharded between pieces — 15 GB more on each 7B rank — to save a reduce-scatter per piece."""
    if enabled or is_sharded(model) or not hasattr(model, "no_sync"):
        yield
    else:
        with model.no_sync():
            yield


def full_tensors(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Whole tensors from FSDP shards (an all-gather per tensor: every rank calls this, in the same order);
    plain tensors pass through."""
    from torch.distributed.tensor import DTensor

    return {name: t.full_tensor() if isinstance(t, DTensor) else t for name, t in tensors.items()}


def full_value(value: torch.Tensor) -> torch.Tensor:
    """A reduced scalar (the gradient norm of sharded gradients is a DTensor) as a plain tensor."""
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


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


def average_gradients(parameters: list[nn.Parameter], world_size: int) -> None:
    """Average the parameters' gradients over the default group in one all-reduce (flattened): what DDP does during
    backward, for a model whose loss does not go through its forward (an actor-critic's evaluate/value). A parameter
    without a gradient joins as zeros, so every rank reduces the same flat layout."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world_size
    offset = 0
    for p, g in zip(parameters, grads):
        p.grad = flat[offset:offset + g.numel()].view_as(g)
        offset += g.numel()


def broadcast_parameters(model: nn.Module, src: int = 0) -> None:
    """Every rank takes rank `src`'s weights (and buffers): the ranks start identical whatever their seeds did."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src)

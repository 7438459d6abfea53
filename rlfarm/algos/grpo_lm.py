"""GRPO for language-model policies as pure stages over plain data (a `Rollout`, numpy rewards, tensors):

    `grpo.group_advantages` → update_policy (clipped token-level loss, minibatches, micro-batches, data parallel)

The on-policy roles (`rlfarm.roles.llm`) run these stages; `rlfarm.algos.ppo_lm` reuses
`update_policy` with per-token advantages. The engine's log-probabilities serve as π_old: it computes them in
fp32 with the learner's own function on the weights just synced, so they equal what the learner would recompute
(tests/engines check this).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from rlfarm.algos.grpo import grpo_loss
from rlfarm.algos.micro_batches import padded_pieces, piece_rows, row_spans, token_pieces
from rlfarm.algos.ppo import approx_kl, clip_fraction, masked_mean
from rlfarm.data import Rollout
from rlfarm.data_parallel import full_value, gradient_sync
from rlfarm.models.compiled import compile_layers
from rlfarm.models.lm import autocast_to, sequence_logprobs
from rlfarm.models.packed import packed_logprobs
from rlfarm.settings import check_ranges

# The default policy: a 2-layer Qwen2 small enough to learn the digit tasks from scratch on a CPU.
TINY_QWEN2 = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 64,
              "tie_word_embeddings": True}


@dataclass(frozen=True)
class GRPOConfig:
    task: str = "copy"
    num_digits: int = 4
    # a config dict (built from scratch; vocab_size comes from the task's tokenizer) or a hub id / folder to load
    model: Mapping[str, Any] | str = field(default_factory=lambda: dict(TINY_QWEN2))
    vocab_size: int | None = None  # a built model's vocabulary rows; None: the task tokenizer's (model.vocab)
    lora: Mapping[str, Any] | None = None
    verifier: str = "partial_credit"
    prompts_per_step: int = 32    # this and lr, minibatches: the digit-task figures in docs/benchmarks.md
    group_size: int = 8
    max_new_tokens: int | None = None  # None: the task's longest answer + 1 for EOS
    temperature: float = 1.0
    top_p: float = 1.0
    lr: float = 1e-3              # the policy's AdamW learning rate (no weight decay)
    max_grad_norm: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0
    norm_std: bool = True
    filter_groups: bool = True    # DAPO dynamic sampling: drop groups whose rewards are all equal
    minibatches: int = 1          # optimizer steps per rollout
    micro_batch_size: int | None = None  # rows per forward/backward (gradient accumulation); None: a whole minibatch
                                         # of a step that kept every group
    micro_batch_tokens: int | None = None  # instead: pieces of at most this many tokens, rows sorted by length, each
                                           # computing only its own columns (`micro_batches.token_pieces`)
    packed: bool = False          # each piece's rows' real tokens as one sequence, no padding computed, the budget
                                  # counting those (`rlfarm.models.packed`)
    activation_checkpointing: bool = False  # recompute each decoder block's activations in the backward pass
    compile_layers: bool = False  # decoder blocks torch.compiled at the first update (`rlfarm.models.compiled`)
    data_parallel: str = "ddp"    # a learner of > 1 GPUs: ddp (whole model per rank) | fsdp (weights, grads, AdamW sharded)
    advantage: str = "grpo"       # grpo: group-normalized rewards | gae: a critic and token-level GAE (algo=ppo_lm)
    gamma: float = 1.0            # gae only: discount over response tokens
    gae_lambda: float = 0.95      # gae only
    critic_lr: float = 1e-3       # gae only: the critic's AdamW learning rate
    value_clip: float | None = 0.2  # gae only: clipped value loss range (None: plain squared error)
    is_correction: str = "none"   # none | token_tis | seq_tis: truncated importance weights learner/engine
    is_cap: float = 2.0           # ... capped here
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        check_ranges(self)


def update_policy(model: nn.Module, optimizer: torch.optim.Optimizer, rollout: Rollout, advantages: torch.Tensor,
                  cfg: GRPOConfig, ref_model: nn.Module | None = None, *, rank: int = 0, world_size: int = 1,
                  compute_dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """`cfg.minibatches` clipped token-level GRPO steps on one rollout; returns mean metrics.

    Every loss term is a token sum divided by the token count of the whole minibatch, so the pieces a
    minibatch is cut into add up to exactly its gradient:
    - gradient accumulation (`cfg.micro_batch_size` rows per forward/backward, one optimizer step), in pieces of one
      size whatever the number of rows the step kept, the last padded with zero-weight rows
      (`rlfarm.algos.micro_batches`: a new shape costs a GPU far more than the padding); or, with
      `cfg.micro_batch_tokens`, pieces of at most that many tokens, the rows sorted by length and each piece cut to
      its own columns (long-tail lengths: no compute on the longest row's padding); `cfg.packed`: each piece's rows'
      real tokens packed into one sequence (`rlfarm.models.packed`: no padding computed at all, the same logprobs);
    - data parallel (world_size > 1, `model` under DDP or FSDP, see rlfarm/data_parallel.py): every rank holds the
      whole rollout, uses rank 0's permutation and takes its shard of each minibatch; its loss is multiplied by
      N (the gradients are averaged over the ranks), and the metrics are summed over the ranks.
    compute_dtype other than float32: the forward passes run under autocast to it (weights, gradients and
    optimizer state stay fp32). `cfg.compile_layers`: the model's decoder blocks are compiled in place at the first
    call (once; after DDP / FSDP wrapped it, as `rlfarm.models.compiled` needs), the reference model stays eager."""
    device = next(model.parameters()).device
    if cfg.compile_layers:
        compile_layers(model, device)
    module = getattr(model, "module", model)  # under DDP: clip the wrapped module's gradients
    input_ids, attention_mask = rollout.input_ids().to(device), rollout.attention_mask().to(device)
    response_mask, engine_logprobs = rollout.response_mask.to(device), rollout.logprobs.to(device)
    advantages, response_start = advantages.to(device), rollout.prompt_ids.shape[1]
    # PPO's ratio is taken against the policy that sampled (the engine's logprobs) unless an importance correction
    # is asked for: then against the learner's own logprobs before this update, each token weighted by
    # learner/engine (truncated), so the engine's numerics or staleness never enter the clip (verl, slime: TIS).
    # With one optimizer step (minibatches = 1) the policy before the update is the one the loss's own forward
    # runs: its detached logprobs are the anchor, and no extra forward pass is paid (`anchored_here`).
    old_logprobs, is_weights, correction = engine_logprobs, None, {}
    anchored_here = cfg.is_correction != "none" and cfg.minibatches == 1
    # pieces of one size whatever the number of rows kept (`rlfarm.algos.micro_batches`)
    size = piece_rows(max(len(input_ids), cfg.prompts_per_step * cfg.group_size), cfg.minibatches, world_size,
                      cfg.micro_batch_size)
    spans = row_spans(attention_mask).tolist() if cfg.micro_batch_tokens else None
    score = packed_logprobs if cfg.packed else sequence_logprobs  # the policy's, TIS's and the reference's forwards
    if cfg.is_correction != "none" and not anchored_here:
        # every rank scores every row, in the pieces a single rank would cut (the same count on all: FSDP gathers)
        old_logprobs = torch.zeros_like(engine_logprobs)
        with torch.no_grad(), autocast_to(device, compute_dtype):
            for rows, _, first, end in rank_pieces(torch.arange(len(input_ids), device=device), spans, 0, 1, size,
                                                   cfg.micro_batch_tokens, response_start, input_ids.shape[1],
                                                   cfg.packed):
                old_logprobs[rows, :end - response_start] = score(
                    model, input_ids[rows, first:end], attention_mask[rows, first:end], response_start - first,
                    rollout.temperature).float()
        is_weights, capped = truncated_is_weights(old_logprobs, engine_logprobs, response_mask, cfg.is_correction,
                                                  cfg.is_cap)
        correction = {"is_capped_fraction": float(capped)}
    order = torch.randperm(len(input_ids), device=device)
    if world_size > 1:
        import torch.distributed as dist

        dist.broadcast(order, src=0)  # one permutation for all ranks, whatever their generators hold
    model.train()
    totals = {"loss": 0.0, "clip_fraction": 0.0, "approx_kl": 0.0, "grad_norm": 0.0}
    for index, rows in enumerate(order.chunk(cfg.minibatches)):
        num_tokens = response_mask[rows].sum().float()  # the whole minibatch's: every term's denominator
        optimizer.zero_grad(set_to_none=True)
        # token sums over this rank's rows of loss, clipped and KL; then |Δ log p| and KL against the engine
        sums = torch.zeros(6, device=device)  # ... and the tokens whose importance weight was capped
        pieces = rank_pieces(rows, spans, rank, world_size, size, cfg.micro_batch_tokens, response_start,
                             input_ids.shape[1], cfg.packed)
        for k, (part, part_weights, first, end) in enumerate(pieces):
            # a piece computes columns [first, end): the responses' first `cols` tokens
            cols = end - response_start

            def cut(tensor: torch.Tensor, part: torch.Tensor = part, cols: int = cols) -> torch.Tensor:
                return tensor[part] if tensor.dim() == 1 else tensor[part, :cols]  # per sample or per token

            mask = cut(response_mask) * part_weights.unsqueeze(1)
            inputs = (input_ids[part, first:end], attention_mask[part, first:end], response_start - first)
            # DDP meets the other ranks once, after the last piece (FSDP after each: `gradient_sync`)
            with gradient_sync(model, enabled=k == len(pieces) - 1):
                with autocast_to(device, compute_dtype):
                    logprobs = score(model, *inputs, rollout.temperature)
                    ref_logprobs = None
                    if cfg.kl_coef:
                        with torch.no_grad():
                            ref_logprobs = score(ref_model, *inputs, rollout.temperature)
                anchor, weights = cut(old_logprobs), None if is_weights is None else cut(is_weights)
                capped = torch.zeros((), device=device)
                if anchored_here:
                    anchor = logprobs.detach().float()
                    weights, capped = truncated_is_weights(anchor, cut(engine_logprobs), mask, cfg.is_correction,
                                                           cfg.is_cap)
                loss = grpo_loss(logprobs, anchor, cut(advantages), mask, cfg.clip_low,
                                 cfg.clip_high, ref_logprobs=ref_logprobs, kl_coef=cfg.kl_coef, num_tokens=num_tokens,
                                 token_weights=weights)
                (loss * world_size).backward()  # under DDP the gradients are averaged: × N makes them a sum
            with torch.no_grad():
                tokens = mask.sum()
                kl = approx_kl(logprobs, anchor, mask).float() * tokens
                # Before the first optimizer step the learner still holds the policy the engine sampled with
                # (or a newer one, if the rollout is stale): what differs there is the engine/learner mismatch.
                unstepped = torch.zeros_like(kl)
                if index == 0:
                    engine = cut(engine_logprobs)
                    unstepped = torch.stack([masked_mean((logprobs - engine).abs(), mask).float() * tokens,
                                             approx_kl(logprobs, engine, mask).float() * tokens])
                sums += torch.cat([torch.stack([loss.detach().float() * num_tokens,
                                                clip_fraction(logprobs, anchor, per_token(cut(advantages)),
                                                              mask, cfg.clip_low, cfg.clip_high).float() * tokens,
                                                kl]),
                                   unstepped.expand(2), (capped.float() * tokens).reshape(1)])
        grad_norm = full_value(torch.nn.utils.clip_grad_norm_(module.parameters(), cfg.max_grad_norm))
        optimizer.step()
        if world_size > 1:
            dist.all_reduce(sums)
        means = (sums / num_tokens.clamp(min=1.0)).tolist()
        for name, value in zip(("loss", "clip_fraction", "approx_kl", "grad_norm"), (*means[:3], float(grad_norm))):
            totals[name] += value / cfg.minibatches
        if index == 0:  # measured on the first minibatch, before any step of this update
            totals["engine_logprob_gap"], totals["engine_kl_k3"] = means[3], means[4]
        if anchored_here:
            correction = {"is_capped_fraction": means[5]}
    model.eval()
    return totals | correction


def policy_optimizer(model: nn.Module, lr: float, device: str | torch.device) -> torch.optim.Optimizer:
    """AdamW without weight decay over the trainable parameters (FSDP shards included). Fused on CUDA: one kernel
    for all tensors, and none of the foreach form's whole-model temporaries (√v alone is 4 B per parameter: 14 GB
    on each of two 7B ranks at the step)."""
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0,
                             fused=torch.device(device).type == "cuda")


def rank_pieces(rows: torch.Tensor, spans: list | None, rank: int, world_size: int, size: int,
                budget: int | None, response_start: int, width: int, packed: bool = False
                ) -> list[tuple[torch.Tensor, torch.Tensor, int, int]]:
    """This rank's forward/backward pieces of a minibatch's rows: (indices, weights, first column, end column).
    With a token budget, `micro_batches.token_pieces` (sorted by length, trimmed to their own columns; `packed`: the
    budget counts real tokens); without, the rank's contiguous share of the rows in pieces of `size` rows, every
    column (a packed forward still computes only their real tokens)."""
    if budget:
        return token_pieces(rows, spans, rank, world_size, budget, response_start, packed=packed)
    mine, weights = rows, torch.ones(len(rows), device=rows.device)
    if world_size > 1:
        from rlfarm.data_parallel import shard_rows

        mine, weights = shard_rows(rows, rank, world_size)
    return [(part, part_weights, 0, width) for part, part_weights in padded_pieces(mine, weights, size)]


def truncated_is_weights(learner_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, mask: torch.Tensor,
                         mode: str, cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Importance weights π_learner/π_engine of the sampled tokens, truncated at `cap` ([N, T], no gradient), and
    the share of valid tokens whose weight the cap cut. token_tis: one ratio per token; seq_tis: the sequence's
    product of ratios, on each of its tokens."""
    log_ratio = (learner_logprobs - engine_logprobs) * mask
    if mode == "seq_tis":
        log_ratio = log_ratio.sum(dim=1, keepdim=True).expand_as(learner_logprobs)
    elif mode != "token_tis":
        raise ValueError(f"is_correction must be none, token_tis or seq_tis, got {mode!r}")
    raw = torch.exp(log_ratio)
    return raw.clamp(max=cap), masked_mean((raw > cap).float(), mask)


def per_token(advantages: torch.Tensor) -> torch.Tensor:
    """Advantages [B] (one per sequence, GRPO) as [B, 1]; per-token ones [B, T] (PPO) as they are."""
    return advantages.unsqueeze(1) if advantages.dim() == 1 else advantages


def rollout_metrics(rollout: Rollout, rewards: np.ndarray, keep: torch.Tensor) -> dict[str, float]:
    valid = rollout.response_mask.bool()
    return {"reward": float(rewards.mean()), "kept_groups": float(keep.float().mean()),
            "response_len": float(valid.sum(1).float().mean()),
            # −log π of the sampled tokens averages to the policy's entropy: it shows a collapse coming
            "entropy": float(-rollout.logprobs[valid].mean())}

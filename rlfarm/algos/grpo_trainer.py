"""Single-process GRPO on a digit task: the on-policy cycle as named stages over plain data.

    prompts → engine.generate → score_rollout → group_advantages → update_policy → sync_weights

Each stage takes and returns plain values (a `Rollout`, numpy rewards, tensors, metric dicts), so the
on-policy loop can run the same stages in separate Ray roles (engine, labeler, learner) unchanged.
The engine's log-probabilities serve as π_old: it computes them in fp32 with the learner's own function
on the weights just synced, so they equal what the learner would recompute (tests/engines check this).
"""
from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from rlfarm.algos.grpo import grpo_advantages, grpo_loss, keep_groups
from rlfarm.algos.ppo import approx_kl, clip_fraction
from rlfarm.distributed import full_value, gradient_sync
from rlfarm.engines.base import Engine, Rollout, StopIds
from rlfarm.engines.hf import HFEngine
from rlfarm.envs.text_tasks import DigitTask
from rlfarm.models.lm import autocast_to, causal_lm, sequence_logprobs, trainable_state_dict
from rlfarm.rewards.verifiers import get_verifier

log = logging.getLogger(__name__)

# ~133k parameters (with the 15-token digit vocabulary): learns to copy 4 digits from scratch in about a CPU minute.
TINY_QWEN2 = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 64,
              "tie_word_embeddings": True}


@dataclass(frozen=True)
class GRPOConfig:
    task: str = "copy"
    num_digits: int = 4
    # a config dict (built from scratch; vocab_size comes from the task's tokenizer) or a hub id / folder to load
    model: Mapping[str, Any] | str = field(default_factory=lambda: dict(TINY_QWEN2))
    lora: Mapping[str, Any] | None = None
    verifier: str = "partial_credit"
    prompts_per_step: int = 32    # copy-4: 16 prompts plateaued on 2 of 4 seeds; 32 reached 0.95 on 9 of 9
    group_size: int = 8
    max_new_tokens: int | None = None  # None: the task's longest answer + 1 for EOS
    temperature: float = 1.0
    top_p: float = 1.0
    lr: float = 1e-3              # copy-4: 1.5e-3 to 3e-3 collapsed the policy's entropy early on some seeds
    max_grad_norm: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0
    norm_std: bool = True
    filter_groups: bool = True    # DAPO dynamic sampling: drop groups whose rewards are all equal
    minibatches: int = 1          # optimizer steps per rollout (copy-4: 2 took fewer rollouts, stalled on 2 of 6 seeds)
    micro_batch_size: int | None = None  # rows per forward/backward (gradient accumulation); None: a whole minibatch
    data_parallel: str = "ddp"    # a learner of > 1 GPUs: ddp (whole model per rank) | fsdp (weights, grads, AdamW sharded)
    advantage: str = "grpo"       # grpo: group-normalized rewards | gae: a critic and token-level GAE (algo=ppo_lm)
    gamma: float = 1.0            # gae only: discount over response tokens
    gae_lambda: float = 0.95      # gae only
    critic_lr: float = 1e-3       # gae only: the critic's AdamW learning rate
    value_clip: float | None = 0.2  # gae only: clipped value loss range (None: plain squared error)
    max_updates: int = 2000
    time_limit_s: float = 300.0
    target_reward: float | None = 0.95  # stop once the reward, averaged over reward_window updates, reaches it
    reward_window: int = 5
    seed: int = 0
    device: str = "cpu"
    num_threads: int | None = None  # torch intra-op threads; None keeps torch's choice
    log_every: int = 10


def score_rollout(rollout: Rollout, answers: list[str], tokenizer, verifier: Callable, eos_id: StopIds) -> np.ndarray:
    """Rewards [N] for the N samples; answers [num_prompts] holds one reference per prompt."""
    completions = [tokenizer.decode(ids) for ids in rollout.completion_ids(eos_id)]
    return verifier(completions, [answer for answer in answers for _ in range(rollout.group_size)])


def group_advantages(rewards: np.ndarray, group_size: int, norm_std: bool = True, filter_groups: bool = True
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages [N], keep [N // group_size]): GRPO advantages and which groups carry signal."""
    groups = torch.as_tensor(rewards, dtype=torch.float32).view(-1, group_size)
    keep = torch.ones(len(groups), dtype=torch.bool)
    if filter_groups:  # unbounded: rewards may be on any scale; a group only needs rewards that differ
        keep = keep_groups(groups, low=-math.inf, high=math.inf)
    return grpo_advantages(groups, norm_std=norm_std).view(-1), keep


def update_policy(model: nn.Module, optimizer: torch.optim.Optimizer, rollout: Rollout, advantages: torch.Tensor,
                  cfg: GRPOConfig, ref_model: nn.Module | None = None, *, rank: int = 0, world_size: int = 1,
                  compute_dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """`cfg.minibatches` clipped token-level GRPO steps on one rollout; returns mean metrics.

    Every loss term is a token sum divided by the token count of the whole minibatch, so the pieces a
    minibatch is cut into add up to exactly its gradient:
    - gradient accumulation (`cfg.micro_batch_size` rows per forward/backward, one optimizer step);
    - data parallel (world_size > 1, `model` under DDP or FSDP, see rlfarm/distributed.py): every rank holds the
      whole rollout, uses rank 0's permutation and takes its shard of each minibatch; its loss is multiplied by
      N (the gradients are averaged over the ranks), and the metrics are summed over the ranks.
    compute_dtype other than float32: the forward passes run under autocast to it (weights, gradients and
    optimizer state stay fp32)."""
    device = next(model.parameters()).device
    module = getattr(model, "module", model)  # under DDP: clip the wrapped module's gradients
    input_ids, attention_mask = rollout.input_ids().to(device), rollout.attention_mask().to(device)
    response_mask, old_logprobs = rollout.response_mask.to(device), rollout.logprobs.to(device)
    advantages, response_start = advantages.to(device), rollout.prompt_ids.shape[1]
    order = torch.randperm(len(input_ids), device=device)
    if world_size > 1:
        import torch.distributed as dist

        from rlfarm.distributed import shard_rows

        dist.broadcast(order, src=0)  # one permutation for all ranks, whatever their generators hold
    model.train()
    totals = {"loss": 0.0, "clip_fraction": 0.0, "approx_kl": 0.0, "grad_norm": 0.0}
    for rows in order.chunk(cfg.minibatches):
        num_tokens = response_mask[rows].sum().float()  # the whole minibatch's: every term's denominator
        if world_size > 1:
            mine, weights = shard_rows(rows, rank, world_size)
        else:
            mine, weights = rows, torch.ones(len(rows), device=device)
        optimizer.zero_grad(set_to_none=True)
        sums = torch.zeros(3, device=device)  # token sums of loss, clipped and KL over this rank's rows
        micro = cfg.micro_batch_size or len(mine)
        pieces = list(zip(mine.split(micro), weights.split(micro)))
        for k, (part, part_weights) in enumerate(pieces):
            mask = response_mask[part] * part_weights.unsqueeze(1)
            # DDP / FSDP meet the other ranks once, after the last piece
            with gradient_sync(model, enabled=k == len(pieces) - 1):
                with autocast_to(device, compute_dtype):
                    logprobs = sequence_logprobs(model, input_ids[part], attention_mask[part], response_start,
                                                 rollout.temperature)
                    ref_logprobs = None
                    if cfg.kl_coef:
                        with torch.no_grad():
                            ref_logprobs = sequence_logprobs(ref_model, input_ids[part], attention_mask[part],
                                                             response_start, rollout.temperature)
                loss = grpo_loss(logprobs, old_logprobs[part], advantages[part], mask, cfg.clip_low,
                                 cfg.clip_high, ref_logprobs=ref_logprobs, kl_coef=cfg.kl_coef, num_tokens=num_tokens)
                (loss * world_size).backward()  # under DDP the gradients are averaged: × N makes them a sum
            with torch.no_grad():
                tokens = mask.sum()
                sums += torch.stack([loss.detach().float() * num_tokens,
                                     clip_fraction(logprobs, old_logprobs[part], per_token(advantages[part]), mask,
                                                   cfg.clip_low, cfg.clip_high) * tokens,
                                     approx_kl(logprobs, old_logprobs[part], mask) * tokens])
        grad_norm = full_value(torch.nn.utils.clip_grad_norm_(module.parameters(), cfg.max_grad_norm))
        optimizer.step()
        if world_size > 1:
            dist.all_reduce(sums)
        means = (sums / num_tokens.clamp(min=1.0)).tolist()
        for name, value in zip(("loss", "clip_fraction", "approx_kl", "grad_norm"), (*means, float(grad_norm))):
            totals[name] += value / cfg.minibatches
    model.eval()
    return totals


def per_token(advantages: torch.Tensor) -> torch.Tensor:
    """Advantages [B] (one per sequence, GRPO) as [B, 1]; per-token ones [B, T] (PPO) as they are."""
    return advantages.unsqueeze(1) if advantages.dim() == 1 else advantages


def sync_weights(model: nn.Module, engine: Engine, version: int) -> None:
    engine.update_weights(trainable_state_dict(model), version)


def rollout_metrics(rollout: Rollout, rewards: np.ndarray, keep: torch.Tensor) -> dict[str, float]:
    valid = rollout.response_mask.bool()
    return {"reward": float(rewards.mean()), "kept_groups": float(keep.float().mean()),
            "response_len": float(valid.sum(1).float().mean()),
            # −log π of the sampled tokens averages to the policy's entropy: it shows a collapse coming
            "entropy": float(-rollout.logprobs[valid].mean())}


@dataclass
class GRPOParts:
    """What one GRPO process holds; in the Ray loop each field lives in its own role."""

    task: DigitTask
    verifier: Callable
    model: nn.Module
    engine: Engine
    optimizer: torch.optim.Optimizer
    ref_model: nn.Module | None
    max_new_tokens: int


def build_parts(cfg: GRPOConfig) -> GRPOParts:
    torch.manual_seed(cfg.seed)
    task = DigitTask(cfg.task, cfg.num_digits, seed=cfg.seed)
    model = causal_lm({**cfg.model, "vocab_size": task.tokenizer.vocab_size}, lora=cfg.lora).to(cfg.device).eval()
    engine = HFEngine(copy.deepcopy(model), pad_id=task.tokenizer.pad_id, device=cfg.device, seed=cfg.seed)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.0)
    ref_model = copy.deepcopy(model).requires_grad_(False) if cfg.kl_coef else None
    return GRPOParts(task, get_verifier(cfg.verifier), model, engine, optimizer, ref_model,
                     cfg.max_new_tokens or task.max_answer_len + 1)


def grpo_step(parts: GRPOParts, cfg: GRPOConfig, version: int) -> dict[str, float]:
    """One on-policy cycle: generate → score → advantages → update → sync. Returns its metrics."""
    tokenizer = parts.task.tokenizer
    prompts = parts.task.sample(cfg.prompts_per_step)
    rollout = parts.engine.generate(prompts.prompt_ids, cfg.group_size, parts.max_new_tokens, cfg.temperature,
                                    cfg.top_p, eos_id=tokenizer.stop_ids)
    rewards = score_rollout(rollout, prompts.answers, tokenizer, parts.verifier, tokenizer.stop_ids)
    advantages, keep = group_advantages(rewards, cfg.group_size, cfg.norm_std, cfg.filter_groups)
    metrics = rollout_metrics(rollout, rewards, keep)
    if keep.any():
        kept_rows = keep.repeat_interleave(cfg.group_size)
        metrics |= update_policy(parts.model, parts.optimizer, rollout.select_groups(keep), advantages[kept_rows],
                                 cfg, parts.ref_model)
        sync_weights(parts.model, parts.engine, version)
    return metrics


def train_grpo(cfg: GRPOConfig, on_update: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """Train a policy on `cfg.task` until the reward target, `max_updates` or `time_limit_s`.

    Returns a summary: updates, wall_s, final_reward (mean over the last reward_window updates),
    seconds_to_target (None if not reached) and history (one metrics dict per update, also passed to
    `on_update`). The clock starts after the model is built.
    """
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    parts = build_parts(cfg)
    history: list[dict] = []
    seconds_to_target = None
    start = time.perf_counter()
    for update in range(cfg.max_updates):
        metrics = {"update": update, **grpo_step(parts, cfg, version=update + 1),
                   "wall_s": time.perf_counter() - start}
        history.append(metrics)
        if on_update:
            on_update(metrics)
        if update % cfg.log_every == 0:
            log.info("update %d reward %.3f entropy %.2f wall %.1fs", update, metrics["reward"], metrics["entropy"],
                     metrics["wall_s"])
        recent_reward = float(np.mean([m["reward"] for m in history[-cfg.reward_window:]]))
        if cfg.target_reward is not None and len(history) >= cfg.reward_window and recent_reward >= cfg.target_reward:
            seconds_to_target = metrics["wall_s"]
            break
        if metrics["wall_s"] > cfg.time_limit_s:
            break
    return {"updates": len(history), "wall_s": time.perf_counter() - start, "final_reward": recent_reward,
            "seconds_to_target": seconds_to_target, "history": history}

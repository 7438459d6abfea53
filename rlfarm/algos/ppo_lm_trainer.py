"""One token-level PPO update of an LM policy and its critic (`algo=ppo_lm`) on one scored rollout:

    critic values of every response prefix → GAE over tokens (reward on the last token) → whitened advantages →
    `cfg.minibatches` clipped policy steps (`grpo_trainer.update_policy`, the same token-level loss, per-token
    advantages) → as many clipped value steps on the critic.

One learner rank (no data parallelism for the critic yet: preflight refuses a multi-GPU learner for ppo_lm).
"""
from __future__ import annotations

import torch
from torch import nn

from rlfarm.algos.grpo_trainer import GRPOConfig, update_policy
from rlfarm.algos.ppo import masked_mean, value_loss
from rlfarm.algos.ppo_lm import token_gae, whiten
from rlfarm.engines.base import Rollout
from rlfarm.models.lm import autocast_to


@torch.no_grad()
def critic_values(critic: nn.Module, inputs: tuple[torch.Tensor, torch.Tensor, int], micro_batch_size: int | None,
                  compute_dtype: torch.dtype) -> torch.Tensor:
    """V [B, T] of the rollout's response prefixes, in micro-batches. `inputs`: (input_ids, attention_mask,
    response_start), the rollout's prompts + responses on the critic's device."""
    input_ids, attention_mask, response_start = inputs
    device = input_ids.device
    step = micro_batch_size or len(input_ids)
    with autocast_to(device, compute_dtype):
        return torch.cat([critic(input_ids[i:i + step], attention_mask[i:i + step], response_start)
                          for i in range(0, len(input_ids), step)])


def update_critic(critic: nn.Module, optimizer: torch.optim.Optimizer, inputs: tuple[torch.Tensor, torch.Tensor, int],
                  mask: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, cfg: GRPOConfig,
                  compute_dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """`cfg.minibatches` steps of the clipped value loss (each a token mean over its minibatch, micro-batches
    sharing the minibatch's token count as denominator, as the policy's). `inputs`: (input_ids, attention_mask,
    response_start) as `critic_values` takes them. Returns the mean value loss."""
    device = old_values.device
    input_ids, attention_mask, start = inputs
    critic.train()
    total = 0.0
    for rows in torch.randperm(len(input_ids), device=device).chunk(cfg.minibatches):
        num_tokens = mask[rows].sum().float()
        optimizer.zero_grad(set_to_none=True)
        for part in rows.split(cfg.micro_batch_size or len(rows)):
            with autocast_to(device, compute_dtype):
                values = critic(input_ids[part], attention_mask[part], start)
            loss = value_loss(values, old_values[part], returns[part], mask[part], cfg.value_clip, count=num_tokens)
            loss.backward()
            total += float(loss.detach()) / cfg.minibatches
        torch.nn.utils.clip_grad_norm_(critic.parameters(), cfg.max_grad_norm)
        optimizer.step()
    critic.eval()
    return {"value_loss": total}


def update_actor_critic(model: nn.Module, optimizer: torch.optim.Optimizer, critic: nn.Module,
                        critic_optimizer: torch.optim.Optimizer, rollout: Rollout, rewards: torch.Tensor,
                        cfg: GRPOConfig, ref_model: nn.Module | None = None,
                        compute_dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """The whole PPO update on one rollout with sequence rewards [B]; returns mean metrics."""
    device = next(critic.parameters()).device
    mask = rollout.response_mask.to(device)
    inputs = (rollout.input_ids().to(device), rollout.attention_mask().to(device), rollout.prompt_ids.shape[1])
    old_values = critic_values(critic, inputs, cfg.micro_batch_size, compute_dtype)
    advantages, returns = token_gae(rewards.to(device), old_values, mask, cfg.gamma, cfg.gae_lambda)
    metrics = update_policy(model, optimizer, rollout, whiten(advantages, mask), cfg, ref_model,
                            compute_dtype=compute_dtype)
    metrics |= update_critic(critic, critic_optimizer, inputs, mask, old_values, returns, cfg, compute_dtype)
    # how far the critic's values were from the returns it is fit to (explained variance is ill-defined once
    # every sample earns the same reward, as a solved task's do)
    value_rmse = masked_mean((returns - old_values).pow(2), mask).sqrt()
    return metrics | {"value_mean": float(masked_mean(old_values, mask)),
                      "return_mean": float(masked_mean(returns, mask)), "value_rmse": float(value_rmse)}

"""Token-level PPO for language-model policies (the RLHF recipe of Ouyang et al. 2022, arXiv:2203.02155, without
the reward model's training): each response token is an action, the verifier's reward arrives at the last one,
and a critic's value of every prefix turns it into per-token advantages by GAE (`rlfarm.algos.ppo.gae`).
One update on one scored rollout, as the learner role runs it (`rlfarm.roles.value_critic` holds the critic):

    `value_targets` (critic values of every response prefix → `token_gae` → whitened advantages) →
    `cfg.minibatches` clipped policy steps (`grpo_lm.update_policy`, the same token-level loss, per-token
    advantages) → `update_critic` (as many clipped value steps on the critic).

One learner rank (no data parallelism for the critic yet: preflight refuses a multi-GPU learner for ppo_lm).
Shapes: B responses of up to T tokens, right-padded; `mask` [B, T] marks the real tokens (a prefix of each row).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from rlfarm.algos.grpo_lm import GRPOConfig
from rlfarm.algos.ppo import gae, masked_mean, value_loss
from rlfarm.data import Rollout
from rlfarm.models.lm import autocast_to


def last_token(mask: torch.Tensor) -> torch.Tensor:
    """One-hot [B, T] of each row's last real token (all zeros for an empty row)."""
    mask = mask.float()
    following = torch.cat([mask[:, 1:], torch.zeros_like(mask[:, :1])], dim=1)
    return mask * (1.0 - following)


def token_gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
              lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages [B, T], returns [B, T]) for sequence rewards [B] paid on each row's last real token.

    values[b, t] = V(prompt + response[:t]), the critic's value of the state in which token t was chosen.
    The episode ends at the last real token (no bootstrap past it); padding gets 0 in both outputs.
    """
    mask = mask.float()
    ends = last_token(mask)
    token_rewards = ends * rewards.float().unsqueeze(1)
    values = values.float() * mask
    next_values = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=1)
    advantages, returns = gae(token_rewards.T, values.T, next_values.T, ends.T, torch.zeros_like(ends.T),
                              gamma, lam)
    return advantages.T * mask, returns.T * mask


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x − mean) / std over the real tokens (the PPO baselines' advantage normalization); padding → 0."""
    mask = mask.float()
    mean = masked_mean(x, mask)
    return (x - mean) * torch.rsqrt(masked_mean((x - mean).pow(2), mask) + eps) * mask


@dataclass(frozen=True)
class ValueTargets:
    """One rollout as the critic valued it before the update: what the policy steps take (`advantages`, whitened
    [B, T]) and what the value steps fit (`returns` [B, T], clipped around `values` [B, T]). `inputs`:
    (input_ids, attention_mask, response_start), the rollout's prompts + responses on the critic's device."""
    inputs: tuple[torch.Tensor, torch.Tensor, int]
    mask: torch.Tensor
    values: torch.Tensor
    returns: torch.Tensor
    advantages: torch.Tensor


def critic_rows(cfg: GRPOConfig, width: int) -> int | None:
    """Rows per critic forward: `micro_batch_size`, else as many rows of the rollout's full `width` as
    `micro_batch_tokens` holds (at least one), else None (whole minibatches). The critic reads every row at the full
    width (no token pieces of its own), so its budget counts the padding too; a budget below one row's width still
    runs one row at a time."""
    if cfg.micro_batch_size:
        return cfg.micro_batch_size
    return max(1, cfg.micro_batch_tokens // width) if cfg.micro_batch_tokens else None


@torch.no_grad()
def critic_values(critic: nn.Module, inputs: tuple[torch.Tensor, torch.Tensor, int], micro_batch_size: int | None,
                  compute_dtype: torch.dtype) -> torch.Tensor:
    """V [B, T] of the rollout's response prefixes, in micro-batches of `micro_batch_size` rows (`critic_rows`;
    `inputs` as `ValueTargets` holds them)."""
    input_ids, attention_mask, response_start = inputs
    step = micro_batch_size or len(input_ids)
    with autocast_to(input_ids.device, compute_dtype):
        return torch.cat([critic(input_ids[i:i + step], attention_mask[i:i + step], response_start)
                          for i in range(0, len(input_ids), step)])


def value_targets(critic: nn.Module, rollout: Rollout, rewards: torch.Tensor, cfg: GRPOConfig,
                  compute_dtype: torch.dtype = torch.float32) -> ValueTargets:
    """The critic's values of a rollout with sequence rewards [B], and the GAE advantages and returns they give."""
    device = next(critic.parameters()).device
    mask = rollout.response_mask.to(device)
    inputs = (rollout.input_ids().to(device), rollout.attention_mask().to(device), rollout.prompt_ids.shape[1])
    values = critic_values(critic, inputs, critic_rows(cfg, inputs[0].shape[1]), compute_dtype)
    advantages, returns = token_gae(rewards.to(device), values, mask, cfg.gamma, cfg.gae_lambda)
    return ValueTargets(inputs, mask, values, returns, whiten(advantages, mask))


def update_critic(critic: nn.Module, optimizer: torch.optim.Optimizer, targets: ValueTargets, cfg: GRPOConfig,
                  compute_dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """`cfg.minibatches` steps of the clipped value loss (each a token mean over its minibatch, micro-batches
    sharing the minibatch's token count as denominator, as the policy's). Returns the mean value loss and how
    the values taken before the steps compare with the returns."""
    input_ids, attention_mask, start = targets.inputs
    mask, old_values, returns = targets.mask, targets.values, targets.returns
    device = old_values.device
    critic.train()
    total, piece = 0.0, critic_rows(cfg, input_ids.shape[1])
    for rows in torch.randperm(len(input_ids), device=device).chunk(cfg.minibatches):
        num_tokens = mask[rows].sum().float()
        optimizer.zero_grad(set_to_none=True)
        for part in rows.split(piece or len(rows)):
            with autocast_to(device, compute_dtype):
                values = critic(input_ids[part], attention_mask[part], start)
            loss = value_loss(values, old_values[part], returns[part], mask[part], cfg.value_clip, count=num_tokens)
            loss.backward()
            total += float(loss.detach()) / cfg.minibatches
        torch.nn.utils.clip_grad_norm_(critic.parameters(), cfg.max_grad_norm)
        optimizer.step()
    critic.eval()
    # how far the critic's values were from the returns it is fit to (explained variance is ill-defined once
    # every sample earns the same reward, as a solved task's do)
    value_rmse = masked_mean((returns - old_values).pow(2), mask).sqrt()
    return {"value_loss": total, "value_mean": float(masked_mean(old_values, mask)),
            "return_mean": float(masked_mean(returns, mask)), "value_rmse": float(value_rmse)}

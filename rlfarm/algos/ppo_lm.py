"""Token-level PPO for language-model policies (the RLHF recipe of Ouyang et al. 2022, arXiv:2203.02155, without
the reward model's training): each response token is an action, the verifier's reward arrives at the last one,
and a critic's value of every prefix turns it into per-token advantages by GAE (`rlfarm.algos.ppo.gae`).
Pure functions of tensors; the update that uses them is `rlfarm.algos.ppo_lm_trainer`.

Shapes: B responses of up to T tokens, right-padded; `mask` [B, T] marks the real tokens (a prefix of each row).
"""
from __future__ import annotations

import torch

from rlfarm.algos.ppo import gae, masked_mean


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

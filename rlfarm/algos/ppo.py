"""Proximal Policy Optimization (Schulman et al. 2017, arXiv:1707.06347) with GAE (Schulman et al. 2016,
arXiv:1506.02438): the math only, as pure functions of tensors.

The same clipped surrogate serves gym PPO ([T, N] steps), token-level PPO for LLMs ([B, T] tokens) and
GRPO (`rlfarm.algos.grpo`); a `mask` marks which elements are real (response tokens, not padding).
"""
from __future__ import annotations

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None = None, count: float | torch.Tensor | None = None
                ) -> torch.Tensor:
    """Σ x·mask / count, count defaulting to Σ mask (all elements when mask is None).

    `count` lets micro-batches share one denominator, so that accumulating their gradients equals the
    gradient of the whole batch's token mean.
    """
    if mask is None:
        return x.mean() if count is None else x.sum() / count
    mask = mask.to(x.dtype)
    total = (x * mask).sum()
    return total / (mask.sum().clamp(min=1.0) if count is None else count)


def gae(rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor, terminated: torch.Tensor,
        truncated: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over a time-major rollout.

    rewards, values, next_values, terminated, truncated: [T, N] (time first; N parallel envs).
    next_values[t] = V(s_{t+1}) for the observation that step t really led to — on a done step that is
    the final observation, not the next episode's reset observation.
    Returns (advantages [T, N], returns [T, N]) with returns = advantages + values (the value target).

        δ_t = r_t + γ (1 − term_t) V(s_{t+1}) − V(s_t)
        A_t = δ_t + γ λ (1 − done_t) A_{t+1},   done_t = term_t ∨ trunc_t

    Termination cuts the bootstrap (the episode really ended); truncation keeps it (time ran out, the
    state still has value) but, like termination, stops the recursion from reaching into the next episode.
    """
    terminated, truncated = terminated.to(values.dtype), truncated.to(values.dtype)
    deltas = rewards + gamma * (1.0 - terminated) * next_values - values
    continues = 1.0 - torch.maximum(terminated, truncated)
    advantages = torch.zeros_like(values)
    next_advantage = torch.zeros_like(values[0])
    for t in reversed(range(values.shape[0])):
        next_advantage = deltas[t] + gamma * lam * continues[t] * next_advantage
        advantages[t] = next_advantage
    return advantages, advantages + values


def clipped_surrogate(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                      clip_low: float, clip_high: float) -> torch.Tensor:
    """Per-element PPO-clip loss (eq. 7), with separate lower and upper clip ranges (DAPO's clip-higher).

        ρ = π_θ(a|s) / π_old(a|s)
        L = −min(ρ A, clip(ρ, 1 − ε_low, 1 + ε_high) A)

    logprobs, old_logprobs: any shape S; advantages: broadcastable to S. Returns L of shape S.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    clipped_ratio = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(-advantages * ratio, -advantages * clipped_ratio)


def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor | None = None, clip_eps: float = 0.2) -> torch.Tensor:
    """Mean PPO-clip loss over the elements `mask` marks. Shapes as `clipped_surrogate`; returns a scalar."""
    return masked_mean(clipped_surrogate(logprobs, old_logprobs, advantages, clip_eps, clip_eps), mask)


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
               mask: torch.Tensor | None = None, clip_eps: float | None = None,
               count: float | torch.Tensor | None = None) -> torch.Tensor:
    """½ E[(V − R)²], or with clip_eps the pessimistic clipped form of the PPO baselines:

        V_clip = V_old + clip(V − V_old, −ε, ε);   ½ E[max((V − R)², (V_clip − R)²)]

    values, old_values, returns, mask: same shape; `count` as in `masked_mean`. Returns a scalar.
    """
    squared_error = (values - returns).pow(2)
    if clip_eps is not None:
        clipped_values = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
        squared_error = torch.maximum(squared_error, (clipped_values - returns).pow(2))
    return 0.5 * masked_mean(squared_error, mask, count)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """H = −Σ_a π(a) log π(a) of a categorical given its logits [..., A]. Returns [...]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def clip_fraction(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                  mask: torch.Tensor | None = None, clip_low: float = 0.2, clip_high: float = 0.2
                  ) -> torch.Tensor:
    """Share of elements whose gradient the clip removed (ratio outside the range on the side A pushes)."""
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = ((ratio > 1.0 + clip_high) & (advantages > 0)) | ((ratio < 1.0 - clip_low) & (advantages < 0))
    return masked_mean(clipped.to(logprobs.dtype), mask)


def approx_kl(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor | None = None
              ) -> torch.Tensor:
    """KL(π_old ‖ π_θ) estimated from samples of π_old with the k3 estimator (ρ − 1) − log ρ ≥ 0."""
    log_ratio = logprobs - old_logprobs
    return masked_mean(torch.expm1(log_ratio) - log_ratio, mask)

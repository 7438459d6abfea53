"""Group Relative Policy Optimization (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300) with the DAPO
refinements (Yu et al. 2025, arXiv:2503.14476): clip-higher, token-level loss, dynamic-sampling filter.

Layout: a batch holds B prompts × G samples, flattened prompt-major (the G samples of prompt 0 first), so
rewards come as [B*G] or [B, G] and per-token tensors as [B*G, T] with a response mask.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from rlfarm.algos.ppo import clipped_surrogate, masked_mean


def _as_groups(rewards: torch.Tensor, group_size: int | None) -> torch.Tensor:
    """[B*G] → [B, G] (group_size required); [B, G] passes through. Groups need G ≥ 2 to have a baseline."""
    if rewards.dim() == 1:
        if group_size is None or rewards.numel() % group_size:
            raise ValueError(f"{rewards.numel()} rewards cannot be split into groups of {group_size}")
        rewards = rewards.view(-1, group_size)
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be [B*G] or [B, G] with G >= 2, got shape {tuple(rewards.shape)}")
    return rewards.float()


def grpo_advantages(rewards: torch.Tensor, group_size: int | None = None, eps: float = 1e-6,
                    norm_std: bool = True) -> torch.Tensor:
    """Outcome advantage of each sample relative to its group (DeepSeekMath §4.1.2):

        Â_i = (r_i − mean(r_1..r_G)) / (std(r_1..r_G) + ε)

    std is the unbiased sample std, as in TRL and verl. norm_std=False drops the division (Dr. GRPO,
    arXiv:2503.20783), which does not up-weight groups whose rewards barely differ.
    rewards: [B*G] (pass group_size) or [B, G]. Returns advantages of the same shape; every token of
    sample i gets Â_i.
    """
    groups = _as_groups(rewards, group_size)
    centered = groups - groups.mean(dim=1, keepdim=True)
    advantages = centered / (groups.std(dim=1, keepdim=True) + eps) if norm_std else centered
    return advantages.view(rewards.shape)


def rloo_advantages(rewards: torch.Tensor, group_size: int | None = None) -> torch.Tensor:
    """REINFORCE leave-one-out (Ahmadian et al. 2024, arXiv:2402.14740): baseline = mean of the others,

        Â_i = r_i − 1/(G−1) Σ_{j≠i} r_j = G/(G−1) (r_i − mean(r))

    rewards: [B*G] (pass group_size) or [B, G]. Returns the same shape.
    """
    groups = _as_groups(rewards, group_size)
    size = groups.shape[1]
    return (size / (size - 1) * (groups - groups.mean(dim=1, keepdim=True))).view(rewards.shape)


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token KL(π_θ ‖ π_ref) with Schulman's unbiased, non-negative k3 estimator (DeepSeekMath eq. 4):

        D = π_ref/π_θ − log(π_ref/π_θ) − 1

    logprobs, ref_logprobs: log-probabilities of the sampled tokens, same shape. Returns that shape.
    """
    log_ratio = ref_logprobs - logprobs
    return torch.expm1(log_ratio) - log_ratio


def grpo_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
              response_mask: torch.Tensor, clip_low: float = 0.2, clip_high: float = 0.28,
              ref_logprobs: torch.Tensor | None = None, kl_coef: float = 0.0,
              num_tokens: float | torch.Tensor | None = None, token_weights: torch.Tensor | None = None
              ) -> torch.Tensor:
    """Token-level clipped GRPO objective, negated for minimization (DAPO eq. 8, plus GRPO's KL term):

        L = 1/Σ_i|o_i| Σ_i Σ_t [ −min(ρ_it Â_i, clip(ρ_it, 1 − ε_low, 1 + ε_high) Â_i) + β D_KL,it ]

    Each valid token of the batch weighs the same, so long answers are not down-weighted as under a
    per-sequence mean; ε_high > ε_low leaves room for unlikely tokens to gain probability (clip-higher).

    logprobs, old_logprobs, response_mask (and ref_logprobs): [N, T]; advantages: [N] or [N, T].
    num_tokens: the denominator Σ|o_i| when this call sees one micro-batch of a larger batch.
    token_weights: [N, T] importance weights on the clipped term (truncated IS for an engine/learner mismatch).
    Returns a scalar.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    per_token = clipped_surrogate(logprobs, old_logprobs, advantages, clip_low, clip_high)
    if token_weights is not None:
        per_token = per_token * token_weights
    if kl_coef:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        per_token = per_token + kl_coef * kl_k3(logprobs, ref_logprobs)
    return masked_mean(per_token, response_mask, count=num_tokens)


def keep_groups(rewards: torch.Tensor, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
    """DAPO dynamic-sampling filter: which groups carry a learning signal.

    Keeps a group when its mean reward (accuracy) lies strictly inside (low, high) and its rewards are
    not all equal: a group that is all right, all wrong, or all alike has Â = 0 for every sample, so it
    would only dilute the token mean.
    rewards: [B, G]. Returns a bool mask [B].
    """
    accuracy = rewards.float().mean(dim=1)
    varies = rewards.amax(dim=1) > rewards.amin(dim=1)
    return (accuracy > low) & (accuracy < high) & varies


def group_advantages(rewards: np.ndarray | torch.Tensor, group_size: int, norm_std: bool = True,
                     filter_groups: bool = True, low: float = -math.inf, high: float = math.inf
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages [N], keep [N // group_size]) of rewards [N], prompt-major: GRPO advantages, and which groups
    pass `keep_groups(low, high)` (all of them without filter_groups). The default bounds are unbounded: rewards
    may be on any scale, and a group then only needs rewards that differ."""
    groups = torch.as_tensor(rewards, dtype=torch.float32).view(-1, group_size)
    keep = keep_groups(groups, low, high) if filter_groups else torch.ones(len(groups), dtype=torch.bool)
    return grpo_advantages(groups, norm_std=norm_std).view(-1), keep

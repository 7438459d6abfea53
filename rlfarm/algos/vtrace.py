"""V-trace (Espeholt et al. 2018, IMPALA, arXiv:1802.01561) and the two actor-learner losses built on it — IMPALA's
actor-critic and APPO's clipped surrogate (Sample Factory, arXiv:2006.11751) — as pure functions of time-major
tensors [T, N] (T steps of N parallel envs), so they are checked against hand-computed values.

Runners act with whatever weights they hold (behaviour policy μ); the learner trains the newer policy π on their
trajectories. V-trace corrects the value targets and the policy-gradient advantages for that lag with truncated
importance ratios: ρ_t = min(ρ̄, π/μ) weighs each temporal difference, c_t = λ min(c̄, π/μ) the trace that carries
it back. With π = μ (and ρ̄, c̄ ≥ 1, λ = 1) the targets are the n-step bootstrapped returns.

Episode ends inside a chunk follow `rlfarm.algos.ppo.gae`: termination cuts the bootstrap, truncation keeps it
(`next_values[t]` is V of the final observation), and neither lets a trace reach into the next episode.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rlfarm.algos.ppo import masked_mean


@dataclass(frozen=True)
class VTrace:
    values: torch.Tensor         # [T, N] v_s: the value targets
    advantages: torch.Tensor     # [T, N] ρ_s (r_s + γ v_{s+1} − V(x_s)): the policy gradient's advantage
    clipped_rho: torch.Tensor    # [T, N] ρ_s, the truncated importance ratios of the actions taken


def vtrace(behaviour_logprobs: torch.Tensor, target_logprobs: torch.Tensor, rewards: torch.Tensor,
           values: torch.Tensor, next_values: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor,
           gamma: float, rho_bar: float = 1.0, c_bar: float = 1.0, lam: float = 1.0) -> VTrace:
    """V-trace targets of one chunk of trajectories (no gradient flows through them).

    behaviour_logprobs: log μ(a_t|x_t) recorded by the runner; target_logprobs: log π(a_t|x_t) of the learner.
    values: V(x_t); next_values[t]: V of the observation step t really led to (the final one on a done step).

        ρ_t = min(ρ̄, π/μ),  c_t = λ min(c̄, π/μ)
        δ_t = ρ_t (r_t + γ (1 − term_t) V(x_{t+1}) − V(x_t))
        v_t − V(x_t) = δ_t + γ c_t (1 − done_t) (v_{t+1} − V(x_{t+1}))
        A_t = ρ_t (r_t + γ (1 − term_t) v'_{t+1} − V(x_t)),  v'_{t+1} = v_{t+1}, or V(x_{t+1}) after a done step
    """
    with torch.no_grad():
        ratio = torch.exp(target_logprobs - behaviour_logprobs)
        rho = ratio.clamp(max=rho_bar)
        c = lam * ratio.clamp(max=c_bar)
        terminated, truncated = terminated.to(values.dtype), truncated.to(values.dtype)
        bootstrap = 1.0 - terminated
        continues = 1.0 - torch.maximum(terminated, truncated)
        deltas = rho * (rewards + gamma * bootstrap * next_values - values)
        corrections = discounted_sums(deltas, gamma * c * continues)  # v_t − V(x_t)
        targets = values + corrections
        # v'_{t+1}: the next step's target inside an episode; past a done step, or past the chunk, V itself
        following = torch.cat([targets[1:], next_values[-1:]])
        next_targets = continues * following + (1.0 - continues) * next_values
        next_targets[-1] = next_values[-1]
        advantages = rho * (rewards + gamma * bootstrap * next_targets - values)
    return VTrace(targets, advantages, rho)


def discounted_sums(x: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """y_t = x_t + factors_t · y_{t+1} (y_T = 0) over the time axis of [T, N] tensors, in a few kernels rather than
    a Python loop of T steps (the loop's kernel launches were a learner's host-side cost): y_t = Σ_{s≥t} G[t, s] x_s
    with G[t, s] = Π_{t≤k<s} factors_k, each product taken directly (a cumulative product per start t, [N, T, T]),
    not as a ratio of running products, which a zero factor (an episode end) would turn into 0/0."""
    steps = x.shape[0]
    ahead = torch.ones(steps, steps, dtype=torch.bool, device=x.device).triu()  # [t, k]: k ≥ t
    # [N, t, k] = factors_k for k ≥ t, 1 before t; its cumulative product over k is Π_{t≤k'≤k} factors_k'
    products = torch.cumprod(torch.where(ahead, factors.T[:, None, :], 1.0), dim=2)
    # G[t, s] = Π_{t≤k<s}: the product up to s − 1 (1 on the diagonal), 0 below it
    weights = torch.cat([torch.ones_like(products[..., :1]), products[..., :-1]], dim=2) * ahead
    return torch.einsum("nts,sn->tn", weights, x)


def impala_loss(logprobs: torch.Tensor, entropy: torch.Tensor, values: torch.Tensor, trace: VTrace,
                value_coef: float = 0.5, entropy_coef: float = 0.01, mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """IMPALA's actor-critic loss: −A_t log π(a_t|x_t) − entropy bonus + value_coef · ½(v_t − V(x_t))², means over
    the (masked) steps. logprobs, entropy, values: the learner's, with gradients; `trace` from `vtrace`."""
    policy = masked_mean(-trace.advantages * logprobs, mask)
    value = masked_mean(0.5 * (trace.values - values) ** 2, mask)
    bonus = masked_mean(entropy, mask)
    loss = policy + value_coef * value - entropy_coef * bonus
    return loss, {"policy_loss": policy.detach(), "value_loss": value.detach(), "entropy": bonus.detach()}


def appo_loss(logprobs: torch.Tensor, anchor_logprobs: torch.Tensor, entropy: torch.Tensor, values: torch.Tensor,
              trace: VTrace, clip: float = 0.1, value_coef: float = 0.5, entropy_coef: float = 0.01,
              mask: torch.Tensor | None = None, anchored_to_target: bool = False
              ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """APPO: PPO's clipped surrogate on the ratio π/anchor, with V-trace's advantages and value targets.

    anchor = μ, the runner's policy (Sample Factory): the advantages are taken without ρ, which the clip already bounds.
    anchor = π_target, a target network refreshed every K updates (RLlib's APPO; `anchored_to_target`): `trace` is
    V-trace with π_target as its target policy, and its advantages keep ρ = min(ρ̄, π_target/μ), the weight that takes
    the runners' actions to π_target's, whose neighbourhood the clip keeps π in."""
    advantages = trace.advantages if anchored_to_target else trace.advantages / trace.clipped_rho.clamp(min=1e-8)
    ratio = torch.exp(logprobs - anchor_logprobs)
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1.0 - clip, 1.0 + clip) * advantages)
    policy = masked_mean(-surrogate, mask)
    value = masked_mean(0.5 * (trace.values - values) ** 2, mask)
    bonus = masked_mean(entropy, mask)
    loss = policy + value_coef * value - entropy_coef * bonus
    clipped = masked_mean(((ratio - 1.0).abs() > clip).float(), mask)
    return loss, {"policy_loss": policy.detach(), "value_loss": value.detach(), "entropy": bonus.detach(),
                  "clip_fraction": clipped.detach()}

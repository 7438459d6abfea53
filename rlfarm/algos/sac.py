"""Soft Actor-Critic (Haarnoja et al. 2018, "SAC: algorithms and applications", arXiv:1812.05905).

The loss functions are pure functions of tensors and read like the paper; `SACAgent` only owns the
networks, optimizers and the order of steps (CleanRL's schedule: critic every update, actor and
temperature `policy_frequency` times every `policy_frequency` updates, Polyak target every update).
"""
from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import torch
from torch import nn


def soft_q_target(reward: torch.Tensor, terminated: torch.Tensor, next_q: torch.Tensor,
                  next_logp: torch.Tensor, alpha: torch.Tensor | float, gamma: float) -> torch.Tensor:
    """y = r + γ (1 − d) (min_i Q̄_i(s', a') − α log π(a'|s')),  a' ~ π(·|s')      (eq. 3 and 5).

    reward, terminated, next_logp: [B]; next_q: [ensemble, B] target-network values. Returns y [B].
    Only *termination* cuts the bootstrap: a time-limit truncation still bootstraps.
    """
    soft_value = next_q.min(dim=0).values - alpha * next_logp
    return reward + gamma * (1.0 - terminated.float()) * soft_value


def critic_loss(q: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """J_Q = Σ_i E[(Q_i(s,a) − y)²]  (eq. 5, summed over the ensemble as in CleanRL). q [E, B], target [B]."""
    return (q - target.unsqueeze(0)).pow(2).mean(dim=1).sum()


def actor_loss(q_pi: torch.Tensor, logp: torch.Tensor, alpha: torch.Tensor | float) -> torch.Tensor:
    """J_π = E[α log π(a|s) − min_i Q_i(s, a)],  a ~ π(·|s) reparameterized  (eq. 7). q_pi [E, B], logp [B]."""
    return (alpha * logp - q_pi.min(dim=0).values).mean()


def temperature_loss(log_alpha: torch.Tensor, logp: torch.Tensor, target_entropy: float) -> torch.Tensor:
    """J(α) = E[−α (log π(a|s) + H̄)]  (eq. 18), optimized in log α for positivity."""
    return -(log_alpha.exp() * (logp.detach() + target_entropy)).mean()


def _adam(params, lr: float) -> torch.optim.Adam:
    # The fused kernel updates all tensors in one pass: more SAC updates/s on a CPU core than foreach.
    return torch.optim.Adam(params, lr=lr, fused=True)


class SACAgent:
    """Networks + optimizers + update order. `update(batch)` takes tensors on `device`.

    Batch keys: obs [B, o], action [B, a], reward [B], next_obs [B, o], terminated [B].
    """

    def __init__(self, obs_dim: int, act_dim: int, action_low, action_high, *,
                 actor: Callable[..., nn.Module], critic: Callable[..., nn.Module],
                 lr: float = 1e-3, actor_lr: float | None = None, critic_lr: float | None = None,
                 alpha_lr: float | None = None, gamma: float = 0.99, tau: float = 0.005,
                 init_alpha: float = 1.0, autotune: bool = True, target_entropy: float | None = None,
                 policy_frequency: int = 2, device: str = "cpu"):
        self.device = torch.device(device)
        self.obs_dim, self.act_dim = obs_dim, act_dim
        self.gamma, self.tau, self.policy_frequency, self.autotune = gamma, tau, policy_frequency, autotune
        self.actor = actor(obs_dim, act_dim, action_low, action_high).to(self.device)
        self.critic = critic(obs_dim, act_dim).to(self.device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self._critic_params = list(self.critic.parameters())
        self.actor_optim = _adam(self.actor.parameters(), actor_lr or lr)
        self.critic_optim = _adam(self.critic.parameters(), critic_lr or lr)
        # Heuristic target entropy −|A| (paper, sec. 5).
        self.target_entropy = float(-act_dim if target_entropy is None else target_entropy)
        self.log_alpha = torch.tensor(float(np.log(init_alpha)), device=self.device, requires_grad=True)
        self.alpha_optim = _adam([self.log_alpha], alpha_lr or lr)
        self.updates = 0

    @property
    def alpha(self) -> torch.Tensor:
        return self.log_alpha.detach().exp()

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """One SAC update. Returns losses as 0-d tensors (no host sync here; the caller reads them lazily)."""
        metrics = {"critic_loss": self._update_critic(batch)}
        if self.updates % self.policy_frequency == 0:
            # Delayed actor: `policy_frequency` steps at once keep the actor/critic update ratio at 1 (CleanRL/TD3).
            for _ in range(self.policy_frequency):
                metrics["actor_loss"], metrics["entropy"] = self._update_actor(batch["obs"])
        self._update_target()
        self.updates += 1
        metrics["alpha"] = self.alpha
        return metrics

    def _update_critic(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            next_action, next_logp = self.actor.sample(batch["next_obs"])
            next_q = self.critic_target(batch["next_obs"], next_action)
            target = soft_q_target(batch["reward"], batch["terminated"], next_q, next_logp, self.alpha, self.gamma)
        loss = critic_loss(self.critic(batch["obs"], batch["action"]), target)
        self.critic_optim.zero_grad(set_to_none=True)
        loss.backward()
        self.critic_optim.step()
        return loss.detach()

    def _update_actor(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        action, logp = self.actor.sample(obs)
        # The critic is a constant here: skip its weight gradients (a third of the backward pass).
        self._critic_requires_grad(False)
        loss = actor_loss(self.critic(obs, action), logp, self.alpha)
        # One backward pass for both losses: their gradients touch disjoint parameters (the actor loss sees α
        # detached, the temperature loss sees log π detached), so each gets exactly its own loss's gradient.
        total = loss + temperature_loss(self.log_alpha, logp, self.target_entropy) if self.autotune else loss
        self.actor_optim.zero_grad(set_to_none=True)
        self.alpha_optim.zero_grad(set_to_none=True)
        total.backward()
        self._critic_requires_grad(True)
        self.actor_optim.step()
        if self.autotune:
            self.alpha_optim.step()
        return loss.detach(), -logp.detach().mean()

    def _critic_requires_grad(self, flag: bool) -> None:
        # The flag set on the cached tensors directly: Module.requires_grad_ walks the module tree every call.
        for param in self._critic_params:
            param.requires_grad_(flag)

    @torch.no_grad()
    def _update_target(self) -> None:
        # θ̄ ← τ θ + (1 − τ) θ̄, one fused foreach call over all tensors.
        torch._foreach_lerp_(list(self.critic_target.parameters()), list(self.critic.parameters()), self.tau)

    def policy_state(self) -> dict[str, torch.Tensor]:
        """The actor's weights on CPU: what env runners need to act."""
        return {k: v.detach().to("cpu", copy=True) for k, v in self.actor.state_dict().items()}

    def state_dict(self) -> dict:
        return {
            "actor": self.actor.state_dict(), "critic": self.critic.state_dict(),
            "critic_target": self.critic_target.state_dict(), "log_alpha": self.log_alpha.detach().clone(),
            "actor_optim": self.actor_optim.state_dict(), "critic_optim": self.critic_optim.state_dict(),
            "alpha_optim": self.alpha_optim.state_dict(), "updates": self.updates,
        }

    def load_state_dict(self, state: dict) -> None:
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.critic_target.load_state_dict(state["critic_target"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.actor_optim.load_state_dict(state["actor_optim"])
        self.critic_optim.load_state_dict(state["critic_optim"])
        self.alpha_optim.load_state_dict(state["alpha_optim"])
        self.updates = int(state["updates"])

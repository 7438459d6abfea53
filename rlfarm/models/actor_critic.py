"""Actor-critic MLP for on-policy learning on vector observations (PPO on gymnasium envs).

One class for both action kinds, chosen by the env's action space: a categorical head for `Discrete`
(`action_low is None`, `act_dim` = number of actions) and a diagonal Gaussian with a state-independent
log σ for boxes (the PPO paper's continuous-control setup). Actor and critic are separate tanh MLPs with
orthogonal initialisation, the small policy head at gain 0.01 (near-uniform first policy) and the value
head at gain 1 — Andrychowicz et al. 2021 ("What matters in on-policy RL") found these choices matter;
CleanRL's ppo.py uses the same.

The Gaussian is not squashed: the env runner clips the sampled action into the box and the learner scores
the unclipped sample, so log π(a|s) stays exact (CleanRL and SB3 do the same).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Distribution, Normal


def tanh_mlp(sizes: Sequence[int], out_gain: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        last = i == len(sizes) - 2
        linear = nn.Linear(sizes[i], sizes[i + 1])
        nn.init.orthogonal_(linear.weight, out_gain if last else math.sqrt(2))
        nn.init.zeros_(linear.bias)
        layers.append(linear)
        if not last:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """π(a|s) and V(s) for one env.

    obs_dim: flat observation size. act_dim: number of actions (discrete) or action dimensions (box).
    action_low, action_high: the box bounds [act_dim], or None for a discrete action space.
    The signature matches the off-policy actor's, so `rlfarm eval` builds either the same way.
    """

    def __init__(self, obs_dim: int, act_dim: int, action_low=None, action_high=None,
                 hidden: Sequence[int] = (64, 64), init_log_std: float = 0.0):
        super().__init__()
        self.discrete = action_low is None
        self.actor = tanh_mlp([obs_dim, *hidden, act_dim], out_gain=0.01)
        self.critic = tanh_mlp([obs_dim, *hidden, 1], out_gain=1.0)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((act_dim,), float(init_log_std)))
            # copies: the bounds may be read-only numpy arrays from the object store
            self.register_buffer("action_low", torch.tensor(np.asarray(action_low), dtype=torch.float32))
            self.register_buffer("action_high", torch.tensor(np.asarray(action_high), dtype=torch.float32))

    def policy_out(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [B, obs_dim] → the policy head's output [B, act_dim]: logits (discrete) or the Gaussian's mean."""
        return self.actor(obs)

    def distribution(self, obs: torch.Tensor) -> Distribution:
        """obs [B, obs_dim] → π(·|s) over B states (actions [B] for discrete, [B, act_dim] for boxes)."""
        return self.distribution_of(self.policy_out(obs))

    def distribution_of(self, out: torch.Tensor) -> Distribution:
        """π(·|s) from the policy head's output."""
        if self.discrete:
            return Categorical(logits=out, validate_args=False)  # the checks cost more than the MLP here
        return Normal(out, self.log_std.exp().expand_as(out), validate_args=False)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [B, obs_dim] → V(s) [B]."""
        return self.critic(obs).squeeze(-1)

    def _log_prob_and_entropy(self, dist: Distribution, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.discrete:
            return dist.log_prob(action), dist.entropy()
        # independent dimensions: log π and H are sums over the action's dimensions
        return dist.log_prob(action).sum(-1), dist.entropy().sum(-1)

    def evaluate(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What the PPO loss needs for stored actions: (log π(a|s) [B], entropy [B], V(s) [B])."""
        logprob, entropy = self._log_prob_and_entropy(self.distribution(obs), action)
        return logprob, entropy, self.value(obs)

    @torch.no_grad()
    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What a rollout records: (action, log π(a|s) [B], V(s) [B]); the action is the raw sample
        (int64 [B] or float32 [B, act_dim], not clipped: see `to_env`)."""
        dist = self.distribution(obs)
        action = dist.sample()
        logprob, _ = self._log_prob_and_entropy(dist, action)
        return action, logprob, self.value(obs)

    @torch.no_grad()
    def sample_with_logprob(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(action, log π(a|s)) without the critic: what an actor-learner's runner records (V is the learner's)."""
        dist = self.distribution(obs)
        action = dist.sample()
        return action, self._log_prob_and_entropy(dist, action)[0]

    def to_env(self, action: torch.Tensor) -> torch.Tensor:
        """The action the env receives: a box action clipped into its bounds; a discrete one as is."""
        return action if self.discrete else torch.max(torch.min(action, self.action_high), self.action_low)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        """Env actions for obs [B, obs_dim]: the mode (argmax / mean) when deterministic, else a sample."""
        if not deterministic:
            return self.to_env(self.distribution(obs).sample())
        out = self.policy_out(obs)
        return out.argmax(-1) if self.discrete else self.to_env(out)

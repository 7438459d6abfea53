"""Small actor-critic networks for continuous control (SAC on MLP observations).

The twin Q-functions are one *ensemble* module whose layers hold stacked weights
``[ensemble, in, out]`` and run as one batched matmul: on a CPU or a launch-bound GPU
that halves the number of kernels per critic pass compared to two separate MLPs.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

# CleanRL / SpinningUp bounds for the policy's log standard deviation.
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


def mlp(sizes: Sequence[int], activation: type[nn.Module] = nn.ReLU) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(activation())
    return nn.Sequential(*layers)


class SquashedGaussianActor(nn.Module):
    """π(a|s) = tanh(N(μ(s), σ(s))) rescaled to the action box (SAC, Haarnoja et al. 2018, App. C)."""

    def __init__(self, obs_dim: int, act_dim: int, action_low, action_high, hidden: Sequence[int] = (256, 256)):
        super().__init__()
        self.trunk = mlp([obs_dim, *hidden], nn.ReLU)
        self.trunk.append(nn.ReLU())
        self.head = nn.Linear(hidden[-1], 2 * act_dim)
        low = torch.tensor(action_low, dtype=torch.float32)  # copies: the bounds may be read-only numpy
        high = torch.tensor(action_high, dtype=torch.float32)
        self.register_buffer("action_scale", (high - low) / 2)
        self.register_buffer("action_bias", (high + low) / 2)

    def _dist_params(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.head(self.trunk(obs)).chunk(2, dim=-1)
        # Smooth squash of log σ into [min, max] keeps gradients alive at the bounds.
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(log_std) + 1)
        return mean, log_std

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """obs [B, obs_dim] → (action [B, act_dim] in the box, log π(a|s) [B])."""
        mean, log_std = self._dist_params(obs)
        std = log_std.exp()
        noise = torch.randn_like(mean)
        pre_tanh = mean + std * noise
        squashed = torch.tanh(pre_tanh)
        # log N(u; μ, σ) − Σ log(scale · (1 − tanh²u)) : change of variables through tanh and the rescale.
        gaussian_logp = (-0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        correction = torch.log(self.action_scale * (1 - squashed.pow(2)) + 1e-6).sum(-1)
        return squashed * self.action_scale + self.action_bias, gaussian_logp - correction

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        if deterministic:
            mean, _ = self._dist_params(obs)
            return torch.tanh(mean) * self.action_scale + self.action_bias
        return self.sample(obs)[0]


class EnsembleLinear(nn.Module):
    """`ensemble` independent linear layers applied as one batched matmul: x [E, B, in] → [E, B, out]."""

    def __init__(self, ensemble: int, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(ensemble, in_features, out_features))
        self.bias = nn.Parameter(torch.empty(ensemble, 1, out_features))
        bound = 1 / math.sqrt(in_features)  # nn.Linear's default init, per member
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias, x, self.weight)


class EnsembleQ(nn.Module):
    """`ensemble` Q-functions Q_i(s, a) in one module; SAC uses two (clipped double-Q)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int] = (256, 256), ensemble: int = 2):
        super().__init__()
        sizes = [obs_dim + act_dim, *hidden, 1]
        self.ensemble = ensemble
        self.layers = nn.ModuleList(EnsembleLinear(ensemble, sizes[i], sizes[i + 1]) for i in range(len(sizes) - 1))

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """obs [B, obs_dim], action [B, act_dim] → Q values [ensemble, B]."""
        x = torch.cat([obs, action], dim=-1).expand(self.ensemble, -1, -1)
        for layer in self.layers[:-1]:
            x = F.relu(layer(x))
        return self.layers[-1](x).squeeze(-1)

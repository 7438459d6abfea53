"""Actor-critic for image observations (Atari, pixels): a convolutional encoder shared by the policy and value heads.

Two encoders, as the literature uses them: `nature` (Mnih et al. 2015, the DQN network: 3 conv layers, 512 units;
what Sample Factory, CleanRL and RLlib use for Atari by default) and `impala` (Espeholt et al. 2018: three stages of
conv + max-pool + two residual blocks, 256 units; stronger, ~3× the compute).

Observations travel flat (as every rlfarm policy takes them, `rlfarm eval` included) and uint8 (0-255); the network
reshapes them to [B, C, H, W] (channels first, as gymnasium's frame-stacked Atari gives them: [stack, 84, 84]) and
scales them to [0, 1]. Everything else (the categorical or Gaussian head, sampling, `to_env`) is the vector
actor-critic's (rlfarm/models/actor_critic.py), with the encoder run once per forward for both heads.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from rlfarm.models.actor_critic import ActorCritic

ENCODERS = ("nature", "impala")


def nature_encoder(channels: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(channels, 32, 8, stride=4), nn.ReLU(),
        nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten())


class ResidualBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


def impala_encoder(channels: int, depths: tuple[int, ...] = (16, 32, 32)) -> nn.Sequential:
    layers: list[nn.Module] = []
    for depth in depths:
        layers += [nn.Conv2d(channels, depth, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
                   ResidualBlock(depth), ResidualBlock(depth)]
        channels = depth
    return nn.Sequential(*layers, nn.ReLU(), nn.Flatten())


class ConvActorCritic(ActorCritic):
    """π(a|s) and V(s) from images. obs_dim: the flat image size (channels × side × side: square images);
    channels: frames stacked (or 3 × frames for RGB); encoder: nature | impala; hidden: units after the encoder."""

    def __init__(self, obs_dim: int, act_dim: int, action_low=None, action_high=None, channels: int = 4,
                 encoder: str = "nature", hidden: int = 512, init_log_std: float = 0.0):
        nn.Module.__init__(self)
        side = math.isqrt(obs_dim // channels)
        if channels * side * side != obs_dim:
            raise ValueError(f"ConvActorCritic needs square images: {obs_dim} values are not {channels} channels of "
                             "side × side pixels (set model.actor.channels)")
        if encoder not in ENCODERS:
            raise ValueError(f"encoder must be one of {ENCODERS}, got {encoder!r}")
        self.image_shape = (channels, side, side)
        self.discrete = action_low is None
        self.encoder = nature_encoder(channels) if encoder == "nature" else impala_encoder(channels)
        with torch.no_grad():
            features = self.encoder(torch.zeros(1, *self.image_shape)).shape[-1]
        self.trunk = nn.Sequential(nn.Linear(features, hidden), nn.ReLU())
        self.policy_head, self.value_head = nn.Linear(hidden, act_dim), nn.Linear(hidden, 1)
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.orthogonal_(module.weight, math.sqrt(2))
                nn.init.zeros_(module.bias)
        nn.init.orthogonal_(self.policy_head.weight, 0.01)  # a near-uniform first policy
        nn.init.orthogonal_(self.value_head.weight, 1.0)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((act_dim,), float(init_log_std)))
            self.register_buffer("action_low", torch.tensor(np.asarray(action_low), dtype=torch.float32))
            self.register_buffer("action_high", torch.tensor(np.asarray(action_high), dtype=torch.float32))

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """obs [B, C·H·W] (0-255, any dtype) → [B, hidden]."""
        images = obs.reshape(-1, *self.image_shape).float() / 255.0
        return self.trunk(self.encoder(images))

    def policy_out(self, obs: torch.Tensor) -> torch.Tensor:
        return self.policy_head(self.features(obs))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.value_head(self.features(obs)).squeeze(-1)

    def evaluate(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        features = self.features(obs)
        logprob, entropy = self._log_prob_and_entropy(self.distribution_of(self.policy_head(features)), action)
        return logprob, entropy, self.value_head(features).squeeze(-1)

    @torch.no_grad()
    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        features = self.features(obs)
        dist = self.distribution_of(self.policy_head(features))
        action = dist.sample()
        logprob, _ = self._log_prob_and_entropy(dist, action)
        return action, logprob, self.value_head(features).squeeze(-1)

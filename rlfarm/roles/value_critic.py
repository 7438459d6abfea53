"""The critic a LMLearner holds under `algo.advantage=gae` (`algo=ppo_lm`): a `TokenCritic` and its AdamW
on the learner's device. It turns a scored rollout into per-token advantages for the policy steps, then fits its
values to that rollout's returns (the math: `rlfarm.algos.ppo_lm`). One learner rank: the critic is not
data-parallel (preflight refuses a multi-GPU learner for ppo_lm)."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from rlfarm.algos.grpo_lm import GRPOConfig
from rlfarm.algos.ppo_lm import ValueTargets, update_critic, value_targets
from rlfarm.data import Rollout
from rlfarm.models.critic import TokenCritic


class ValueCritic:
    """causal_lm: the backbone to start from (the policy's architecture and starting weights, without LoRA)."""

    def __init__(self, causal_lm: nn.Module, cfg: GRPOConfig, compute_dtype: torch.dtype = torch.float32):
        self.cfg, self.compute_dtype = cfg, compute_dtype
        self.model = TokenCritic(causal_lm).to(cfg.device).eval()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.critic_lr, weight_decay=0.0)

    def targets(self, rollout: Rollout, rewards: np.ndarray) -> ValueTargets:
        """The rollout valued by the critic as it stands: the policy steps' advantages and the value steps' targets."""
        return value_targets(self.model, rollout, torch.as_tensor(rewards), self.cfg, self.compute_dtype)

    def fit(self, targets: ValueTargets) -> dict[str, float]:
        """The value steps on the rollout `targets` valued; returns their metrics."""
        return update_critic(self.model, self.optimizer, targets, self.cfg, self.compute_dtype)

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

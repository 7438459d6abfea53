"""PPO on env rollouts: the learner's stages as functions over plain data (an `EnvRollout`, tensors).

    rollout → advantages_and_returns (GAE) → ppo_update (epochs × minibatches of the clipped loss)

The loss composes the pure pieces of `rlfarm.algos.ppo` (Schulman et al. 2017, eq. 9):

    L = L_clip(θ) + c_v · L_V(θ) − c_H · H[π_θ]

The PPO learner role runs these; tests run them without Ray. Defaults follow CleanRL's ppo.py / the PPO
paper's Atari settings where the config leaves a choice open.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from rlfarm.algos.ppo import approx_kl, clip_fraction, gae, policy_loss, value_loss
from rlfarm.buffers.rollout import EnvRollout
from rlfarm.settings import check_ranges, known_fields


@dataclass(frozen=True)
class PPOConfig:
    lr: float = 2.5e-4
    anneal_lr: bool = True         # lr falls linearly to 0 over the run (PPO paper, Atari)
    gamma: float = 0.99
    gae_lambda: float = 0.95
    epochs: int = 4                # passes over each rollout
    minibatches: int = 4           # optimizer steps per pass
    clip_eps: float = 0.2
    value_clip_eps: float | None = 0.2  # None: plain ½(V − R)²
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    max_grad_norm: float = 0.5
    norm_adv: bool = True          # advantages normalized per minibatch
    target_kl: float | None = None  # stop the epochs early once the approximate KL passes this

    def __post_init__(self) -> None:
        check_ranges(self)

    @classmethod
    def from_mapping(cls, values: Mapping) -> "PPOConfig":
        """The PPO fields of an algo config (other keys, e.g. rollout_steps, belong to the loop)."""
        return cls(**known_fields(cls, values))


def advantages_and_returns(rollout: dict[str, torch.Tensor], gamma: float, lam: float
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over a rollout's tensors ([T, N] each, see EnvRollout). Returns (advantages, returns) [T, N]."""
    return gae(rollout["reward"], rollout["value"], rollout["next_value"], rollout["terminated"],
               rollout["truncated"], gamma, lam)


def flatten_for_update(rollout: EnvRollout, cfg: PPOConfig, device: str = "cpu") -> dict[str, torch.Tensor]:
    """[T, N, ...] tensors → [T·N, ...], with GAE advantages and value targets added."""
    tensors = rollout.tensors(device)
    tensors["advantage"], tensors["return"] = advantages_and_returns(tensors, cfg.gamma, cfg.gae_lambda)
    steps = rollout.transitions
    return {k: v.reshape(steps, *v.shape[2:]) for k, v in tensors.items()}


def ppo_loss(model: nn.Module, batch: Mapping[str, torch.Tensor], cfg: PPOConfig
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PPO objective on a minibatch of flat transitions (keys of `flatten_for_update`, [B] each).
    Returns (scalar loss, detached parts)."""
    logprob, entropy, value = model.evaluate(batch["obs"], batch["action"])
    advantage = batch["advantage"]
    if cfg.norm_adv and advantage.numel() > 1:
        advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
    pg_loss = policy_loss(logprob, batch["logprob"], advantage, clip_eps=cfg.clip_eps)
    v_loss = value_loss(value, batch["value"], batch["return"], clip_eps=cfg.value_clip_eps)
    entropy_mean = entropy.mean()
    loss = pg_loss + cfg.vf_coef * v_loss - cfg.ent_coef * entropy_mean
    with torch.no_grad():
        parts = {"policy_loss": pg_loss, "value_loss": v_loss, "entropy": entropy_mean,
                 "approx_kl": approx_kl(logprob, batch["logprob"]),
                 "clip_fraction": clip_fraction(logprob, batch["logprob"], advantage, None, cfg.clip_eps, cfg.clip_eps)}
    return loss, {k: v.detach() for k, v in parts.items()}


def ppo_update(model: nn.Module, optimizer: torch.optim.Optimizer, batch: Mapping[str, torch.Tensor],
               cfg: PPOConfig, generator: torch.Generator | None = None) -> dict[str, float]:
    """`cfg.epochs` passes over the flat batch in `cfg.minibatches` shuffled minibatches, one clipped-gradient
    Adam step each. Returns the mean of each loss part over the steps taken, and how many were taken."""
    size = int(batch["reward"].shape[0])
    totals: dict[str, float] = {}
    steps = 0
    for _ in range(cfg.epochs):
        order = torch.randperm(size, generator=generator, device=batch["reward"].device)
        kl_this_epoch = []
        for index in torch.tensor_split(order, min(cfg.minibatches, size)):  # a short last rollout: fewer
            loss, parts = ppo_loss(model, {k: v[index] for k, v in batch.items()}, cfg)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            parts["grad_norm"] = nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            steps += 1
            kl_this_epoch.append(float(parts["approx_kl"]))
            for key, value in parts.items():
                totals[key] = totals.get(key, 0.0) + float(value)
        if cfg.target_kl is not None and sum(kl_this_epoch) / len(kl_this_epoch) > cfg.target_kl:
            break
    metrics = {key: value / max(steps, 1) for key, value in totals.items()}
    metrics["gradient_steps"] = steps
    metrics["explained_variance"] = explained_variance(batch["value"], batch["return"])
    return metrics


def explained_variance(predicted: torch.Tensor, target: torch.Tensor) -> float:
    """1 − Var[target − predicted] / Var[target]: 1 is a perfect critic, 0 no better than a constant."""
    variance = target.var()
    return float("nan") if variance == 0 else float(1 - (target - predicted).var() / variance)

"""PPO with a critic for vision-language-action policies on a simulator (`algo=ppo_vla`), as pure stages:
episode outcomes → a reward per policy call → values → GAE over action chunks (`chunk_advantages`) → epochs of
clipped token-level policy loss + value loss (`update_ppo_vla`).

The time step of this MDP is one policy call: the observation, the K×D action tokens sampled for it, and the K
simulator steps their chunk played. The outcome reward is binary (the task's success), paid on the call whose
chunk reached it; every episode ends on its last call (success, the step budget, or the call budget), so nothing
is bootstrapped past it. Published VLA PPO studies (VLA-RL, RLinf's VLA PPO, "What can RL bring to VLA
generalization") put the value head on the policy's own backbone and score the chunk's tokens jointly; here each
action token gets its call's advantage and is clipped on its own, as the GRPO-VLA loss does (`grpo_loss`), so the
two algorithms differ only in where the advantage comes from: a learned baseline per call instead of the group's
mean outcome. `critic="separate"` gives the value head a copy of the policy's network of its own instead.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rlfarm.algos.grpo import grpo_loss
from rlfarm.algos.ppo import approx_kl, clip_fraction, gae, value_loss
from rlfarm.algos.vla import VLAConfig, call_rows

CRITICS = ("shared", "separate")
VALUE_BATCH = 512  # observations per no-grad value pass (a VLA-sized policy holds activations for this many)


@dataclass(frozen=True)
class PPOVLAConfig(VLAConfig):
    groups_per_update: int = 64       # initial states per update; PPO needs no groups: group_size 1 by default
    group_size: int = 1
    gamma: float = 0.99               # per policy call (an action chunk)
    gae_lambda: float = 0.95
    value_coef: float = 0.5
    value_clip: float | None = None   # PPO's clipped value loss around the rollout's values; None: plain squared error
    epochs: int = 4                   # passes over the rollout's calls, each in `minibatches` optimizer steps
    minibatches: int = 4
    critic: str = "shared"            # shared: value head on the policy's trunk; separate: a network of its own
    clip_high: float = 0.2            # symmetric clip by default (PPO's); raise for clip-higher

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.critic not in CRITICS:
            raise ValueError(f"critic={self.critic!r}: use one of {', '.join(CRITICS)}")


def chunk_rewards(batch: dict) -> tuple[np.ndarray, np.ndarray]:
    """(rewards [N, C], last [N, C]): the success (1 or 0) on each episode's last policy call, and that call's mark.
    Calls run from 0 without gaps (`called` is a prefix), so an episode's last call is its count − 1."""
    called = np.asarray(batch["called"])
    last = np.zeros_like(called)
    count = called.sum(1)
    ended = count > 0
    last[np.flatnonzero(ended), count[ended] - 1] = True
    rewards = last * np.asarray(batch["success"], np.float32)[:, None]
    return rewards.astype(np.float32), last


def chunk_advantages(values: torch.Tensor, rewards: torch.Tensor, last: torch.Tensor, gamma: float, lam: float
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over each episode's policy calls. values, rewards, last: [N, C] (0 past an episode's last call).
    Returns (advantages, returns) [N, C]; an episode's last call bootstraps from nothing (the episode is over)."""
    next_values = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=1)
    advantages, returns = gae(rewards.T, values.T, next_values.T, last.T, torch.zeros_like(last.T), gamma, lam)
    return advantages.T, returns.T


@torch.no_grad()
def rollout_values(value_fn, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """V of every call's observation under the weights that sampled them (the learner's, before this update)."""
    count = len(inputs[0])
    return torch.cat([value_fn(*(x[at:at + VALUE_BATCH] for x in inputs)).float()
                      for at in range(0, count, VALUE_BATCH)]) if count else torch.zeros(0)


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float:
    """1 − Var(R − V) / Var(R): 1 is a perfect critic, 0 no better than a constant, < 0 worse."""
    variance = returns.var(unbiased=False)
    return float(1 - (returns - values).var(unbiased=False) / variance) if variance > 0 else 0.0


def update_ppo_vla(model, critic, optimizer: torch.optim.Optimizer, batch: dict, cfg: PPOVLAConfig,
                   device: str = "cpu") -> dict[str, float]:
    """`cfg.epochs` × `cfg.minibatches` PPO steps over every policy call of the batch. `critic` is None with a
    shared trunk (the policy's own value head), else the separate network whose value head is used."""
    rows, (image, words, proprio, tokens, old) = call_rows(batch, device)
    inputs = (image, words, proprio)
    value_of = (critic or model).values
    old_values = rollout_values(value_of, inputs)
    rewards, last = (torch.as_tensor(x, device=device).float() for x in chunk_rewards(batch))
    grid = torch.zeros_like(rewards)
    grid[rows] = old_values
    advantages, returns = (x[rows] for x in chunk_advantages(grid, rewards, last, cfg.gamma, cfg.gae_lambda))
    raw_advantages = advantages
    if cfg.norm_std and len(advantages) > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    mask = torch.ones_like(old)
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    totals = dict.fromkeys(("loss", "policy_loss", "value_loss", "clip_fraction", "approx_kl", "grad_norm"), 0.0)
    steps = cfg.epochs * cfg.minibatches
    networks = [model] + ([critic] if critic is not None else [])
    for network in networks:
        network.train()
    for _ in range(cfg.epochs):
        for part in torch.randperm(len(tokens), device=device).chunk(cfg.minibatches):
            batch_inputs = tuple(x[part] for x in inputs)
            if critic is None:
                logprobs, values = model.token_logprobs_and_values(*batch_inputs, tokens[part], cfg.temperature)
            else:
                logprobs = model.token_logprobs(*batch_inputs, tokens[part], cfg.temperature)
                values = critic.values(*batch_inputs)
            policy = grpo_loss(logprobs, old[part], advantages[part], mask[part], cfg.clip_low, cfg.clip_high)
            value = value_loss(values, old_values[part], returns[part], clip_eps=cfg.value_clip)
            loss = policy + cfg.value_coef * value
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(parameters, cfg.max_grad_norm)
            optimizer.step()
            with torch.no_grad():
                adv = advantages[part].unsqueeze(1)
                step = {"loss": float(loss), "policy_loss": float(policy), "value_loss": float(value),
                        "grad_norm": float(grad_norm),
                        "clip_fraction": float(clip_fraction(logprobs, old[part], adv, mask[part], cfg.clip_low,
                                                             cfg.clip_high)),
                        "approx_kl": float(approx_kl(logprobs, old[part], mask[part]))}
            for name, value_ in step.items():
                totals[name] += value_ / steps
    for network in networks:
        network.eval()
    return totals | {"policy_calls": float(len(tokens)), "value_mean": float(old_values.mean()),
                     "advantage_mean": float(raw_advantages.mean()), "return_mean": float(returns.mean()),
                     "explained_variance": explained_variance(old_values, returns)}

"""GRPO for vision-language-action policies on a simulator (SimpleVLA-RL's recipe), as pure stages: episode
successes → group advantages with dynamic sampling (`group_signal`) → clipped token-level GRPO steps over every
action token of the kept groups' policy calls (`update_vla`, the loss of `rlfarm.algos.grpo`).
The roles that collect episodes and hold the learner live in `rlfarm.roles.vla`."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from rlfarm.algos.grpo import group_advantages, grpo_loss
from rlfarm.algos.ppo import approx_kl, clip_fraction
from rlfarm.models.vla import TinyVLA
from rlfarm.settings import check_ranges


@dataclass(frozen=True)
class VLAConfig:
    env_id: str = "SapienPushCube"                # a task of rlfarm.envs.vla_tasks
    env: dict = field(default_factory=dict)       # the task's keyword arguments
    chunk_size: int = 4                           # K actions per policy call
    bins: int = 256
    model: dict = field(default_factory=dict)     # TinyVLA keyword arguments (width, ...)
    groups_per_update: int = 8                    # initial states per update (B)
    group_size: int = 8                           # rollouts per initial state (G)
    temperature: float = 1.6
    lr: float = 1e-3
    max_grad_norm: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.28
    minibatches: int = 1
    accuracy_low: float = 0.1                     # dynamic sampling: keep groups with low < accuracy < high
    accuracy_high: float = 0.9
    norm_std: bool = True
    pipeline: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        check_ranges(self)


def group_signal(success: np.ndarray, cfg: VLAConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages [N], keep [B]): GRPO advantages of the episodes, and which groups pass dynamic sampling
    (accuracy strictly between accuracy_low and accuracy_high, SimpleVLA-RL keeps 0.1 < acc < 0.9)."""
    return group_advantages(success, cfg.group_size, cfg.norm_std, low=cfg.accuracy_low, high=cfg.accuracy_high)


CALL_FIELDS = ("image", "words", "proprio", "tokens", "logprobs")


def call_rows(batch: dict, device: str = "cpu", episodes: torch.Tensor | None = None
              ) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]:
    """Every policy call of the batch's episodes (all, or `episodes`) as rows: ((episode, call) indices of the rows
    into the [E, C] grid, ([R, ...] tensors of `CALL_FIELDS` on `device`))."""
    chosen = slice(None) if episodes is None else episodes
    rows = torch.as_tensor(batch["called"])[chosen].nonzero(as_tuple=True)
    return rows, tuple(torch.as_tensor(batch[name])[chosen][rows].to(device) for name in CALL_FIELDS)


def update_vla(model: TinyVLA, optimizer: torch.optim.Optimizer, batch: dict, advantages: torch.Tensor,
               episodes: torch.Tensor, cfg: VLAConfig, device: str = "cpu") -> dict[str, float]:
    """`cfg.minibatches` clipped token-level GRPO steps over every policy call of the chosen episodes.
    Every action token of an episode's calls gets that episode's advantage (the outcome reward is binary)."""
    (chosen, _), (image, words, proprio, tokens, old) = call_rows(batch, device, episodes)
    row_advantages = advantages[episodes][chosen].to(device)
    mask = torch.ones_like(old)
    model.train()
    totals = {"loss": 0.0, "clip_fraction": 0.0, "approx_kl": 0.0, "grad_norm": 0.0}
    for part in torch.randperm(len(tokens), device=device).chunk(cfg.minibatches):
        logprobs = model.token_logprobs(image[part], words[part], proprio[part], tokens[part], cfg.temperature)
        loss = grpo_loss(logprobs, old[part], row_advantages[part], mask[part], cfg.clip_low, cfg.clip_high)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        optimizer.step()
        with torch.no_grad():
            adv = row_advantages[part].unsqueeze(1)
            step = {"loss": float(loss), "grad_norm": float(grad_norm),
                    "clip_fraction": float(clip_fraction(logprobs, old[part], adv, mask[part], cfg.clip_low,
                                                         cfg.clip_high)),
                    "approx_kl": float(approx_kl(logprobs, old[part], mask[part]))}
        for name, value in step.items():
            totals[name] += value / cfg.minibatches
    model.eval()
    return totals | {"policy_calls": float(len(tokens))}

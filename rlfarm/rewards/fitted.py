"""Reward models fitted to frames by `rlfarm fit-reward`, and the file that carries one to the labelers.

Both networks map frames [n, H, W, 3] uint8 to rewards [n] in the target's own units, in two parts:
`features(frames)` (frozen or cheap: no trained weights) and `head(features)`, trained on the target
standardized by `target_mean` / `target_std` (buffers saved with the weights), so the fit sees unit-scale
targets whatever the env's reward scale, and the labelers get rewards in the env's scale back.

- `PixelCNN`: a small conv net trained end to end on the pixels (Nature-DQN-like, sized for 32–128 px).
- `GoalBaselineHead`: the VLM-RMs goal-baseline form (`rlfarm.rewards.clip.goal_baseline_reward`) on a frozen
  CLIP vision tower's unit embeddings, with the goal and baseline *embeddings* learned instead of prompted.
  The tower's weights are not saved (they stay in their folder); the file holds the head.

A fitted-reward file (`save_fitted`, `load_fitted`) is self-describing: the module's `_target_` node, its
trained state (frozen parts left out), the frame size it was fitted at and what it was fitted to, so
`reward=model reward.model=<file>` needs nothing else.
"""
from __future__ import annotations

import abc
import os
import zipfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from rlfarm.rewards.base import RewardModelError
from rlfarm.rewards.clip import goal_baseline_reward

FORMAT = "rlfarm.fitted_reward/1"


class FittedReward(nn.Module, abc.ABC):
    """What the fitter and the labelers need of a fitted network: features → head, in the target's units.

    frozen_prefixes: state-dict prefixes that are not trained and not saved (a pretrained tower).
    cache_features: whether features of a whole dataset fit in memory (the fitter computes them once).
    """

    frozen_prefixes: tuple[str, ...] = ()
    cache_features = False

    def __init__(self):
        super().__init__()
        self.register_buffer("target_mean", torch.zeros(()))
        self.register_buffer("target_std", torch.ones(()))

    @abc.abstractmethod
    def features(self, frames: torch.Tensor) -> torch.Tensor:
        """frames [n, S, S, 3k] uint8 → what the head reads (no trained weights in here)."""

    @abc.abstractmethod
    def head(self, features: torch.Tensor) -> torch.Tensor:
        """features → standardized reward [n]."""

    def init_head(self, features: torch.Tensor, standardized_targets: torch.Tensor) -> None:
        """A data-dependent start for the head (optional)."""

    def set_target_stats(self, mean: float, std: float) -> None:
        self.target_mean.fill_(mean)
        self.target_std.fill_(max(std, 1e-6))

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        """frames [n, H, W, 3] uint8 → rewards [n] float32 in the target's units."""
        return self.head(self.features(frames)).float() * self.target_std + self.target_mean

    def trained_state(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.state_dict().items() if not k.startswith(self.frozen_prefixes)}


class PixelCNN(FittedReward):
    """A conv net on the frame: 3 strided convolutions, then an MLP. frame_size: the side it is built for;
    frame_stack: consecutive renders per frame (3 channels each; 2 lets it see motion)."""

    def __init__(self, frame_size: int = 64, channels: tuple[int, ...] = (32, 64, 64), hidden: int = 256,
                 frame_stack: int = 1):
        super().__init__()
        layers, in_channels = [], 3 * frame_stack
        for i, out_channels in enumerate(channels):
            layers += [nn.Conv2d(in_channels, out_channels, 5 if i == 0 else 3, stride=2, padding=1), nn.ReLU()]
            in_channels = out_channels
        self.convs = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, 3 * frame_stack, frame_size, frame_size)).shape[1]
        self.mlp = nn.Sequential(nn.Linear(flat, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def features(self, frames: torch.Tensor) -> torch.Tensor:
        return frames.permute(0, 3, 1, 2).float().div(255).sub(0.5)

    def head(self, features: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.convs(features)).squeeze(-1)


class GoalBaselineHead(FittedReward):
    """r = gain · goal_baseline_reward(x, ĝ, b̂, α) + bias (standardized), x the frozen tower's unit embedding of
    the frame, ĝ and b̂ learned unit vectors (VLM-RMs eq. 3 with embeddings in place of prompts).

    tower: a folder written by save_pretrained holding a CLIPModel (only its vision tower and projection are used).
    """

    frozen_prefixes = ("tower.", "projection.", "pixel_")
    cache_features = True

    def __init__(self, tower: str, alpha: float = 0.5):
        super().__init__()
        from rlfarm.rewards.clip import _load_vision, _pixel_stats

        clip = _load_vision(tower)
        self.tower, self.projection = clip.vision_model.eval(), clip.visual_projection.eval()
        self.tower.requires_grad_(False)
        self.projection.requires_grad_(False)
        self.image_size, self.alpha = clip.config.vision_config.image_size, alpha
        mean, std = _pixel_stats(tower)
        self.register_buffer("pixel_mean", torch.tensor(mean).view(1, 3, 1, 1))
        self.register_buffer("pixel_std", torch.tensor(std).view(1, 3, 1, 1))
        dim = clip.config.projection_dim
        self.goal = nn.Parameter(torch.randn(dim) / dim**0.5)
        self.baseline = nn.Parameter(torch.randn(dim) / dim**0.5)
        self.gain, self.bias = nn.Parameter(torch.ones(())), nn.Parameter(torch.zeros(()))

    @torch.no_grad()
    def features(self, frames: torch.Tensor) -> torch.Tensor:
        pixels = frames.permute(0, 3, 1, 2).float() / 255
        if pixels.shape[-1] != self.image_size:
            pixels = F.interpolate(pixels, size=(self.image_size, self.image_size), mode="bicubic", antialias=True)
        dtype = self.pixel_mean.dtype if not torch.is_autocast_enabled(pixels.device.type) else pixels.dtype
        pixels = ((pixels - self.pixel_mean) / self.pixel_std).to(dtype)
        embedding = self.projection(self.tower(pixel_values=pixels).pooler_output)
        return F.normalize(embedding.float(), dim=-1)

    def head(self, features: torch.Tensor) -> torch.Tensor:
        goal, baseline = F.normalize(self.goal, dim=0), F.normalize(self.baseline, dim=0)
        return self.gain * goal_baseline_reward(features.float(), goal, baseline, self.alpha) + self.bias

    @torch.no_grad()
    def init_head(self, features: torch.Tensor, standardized_targets: torch.Tensor) -> None:
        """The goal starts at the mean embedding of the best-scored tenth of the frames, the baseline at the mean
        of all (the prompts' roles in VLM-RMs: the task vs the scene); gain and bias by least squares."""
        best = standardized_targets >= torch.quantile(standardized_targets, 0.9)
        self.goal.copy_(F.normalize(features[best].mean(0), dim=0))
        self.baseline.copy_(F.normalize(features.mean(0), dim=0))
        raw = goal_baseline_reward(features, self.goal, self.baseline, self.alpha)
        centered = raw - raw.mean()
        gain = (centered * (standardized_targets - standardized_targets.mean())).sum() / centered.pow(2).sum().clamp_min(1e-12)
        self.gain.fill_(float(gain))
        self.bias.fill_(float(standardized_targets.mean() - gain * raw.mean()))


def save_fitted(path: str | Path, module_node: dict, net: FittedReward, frame_size: int, fitted_to: dict,
                frame_stack: int = 1) -> Path:
    """Write a fitted-reward file: the module's `_target_` node, its trained state, the frame size and stack it
    reads and what it was fitted to (target, env, held-out error). Atomic: a temp file, then a rename."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    state = {k: v.detach().cpu() for k, v in net.trained_state().items()}
    torch.save({"format": FORMAT, "module": module_node, "state": state, "frame_size": int(frame_size),
                "frame_stack": int(frame_stack), "fitted_to": fitted_to}, tmp)
    os.replace(tmp, path)
    return path


def read_fitted(path: str | Path) -> dict:
    """A fitted-reward file's content (weights on CPU), or a one-line RewardModelError."""
    try:
        content = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - whatever torch says, the user gets one line
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if not zipfile.is_zipfile(path):
            reason = "not a file torch.save or torch.jit.save wrote"
        elif reason.startswith("Weights only load failed"):
            reason = "it holds pickled objects, not only tensors (a whole module saved with torch.save?)"
        raise RewardModelError(f"cannot read fitted reward {str(path)!r}: {reason}; give a TorchScript file "
                               "(torch.jit.save) or one written by rlfarm fit-reward") from None
    if not isinstance(content, dict) or content.get("format") != FORMAT:
        raise RewardModelError(f"{str(path)!r} is not a fitted-reward file (written by rlfarm fit-reward); "
                               "for a plain state_dict set reward.module=<node> reward.checkpoint=<file>")
    return content


def build_fitted(content: dict) -> FittedReward:
    """The network of a fitted-reward file's content, its trained weights loaded (frozen parts from their folder)."""
    from hydra.utils import instantiate

    net = instantiate(content["module"])
    missing, unexpected = net.load_state_dict(content["state"], strict=False)
    untrained = [k for k in missing if not k.startswith(net.frozen_prefixes)]
    if untrained or unexpected:
        raise RewardModelError(f"fitted reward does not match its module {content['module'].get('_target_')}: "
                               f"missing {untrained[:3]}, unexpected {list(unexpected)[:3]}; fit it again")
    return net

"""Fit a `FittedReward` network to labelled frames, holding out whole episodes, keeping the best epoch.

The loss is the mean squared error on standardized targets (the network's `target_mean` / `target_std` undo
the standardization at labelling time). Networks whose features are frozen (a CLIP tower) have them computed
once for every frame, so each epoch trains only the head; a CNN computes them per minibatch (its "features"
are the pixels as floats: four times the frames' memory if kept). On CUDA the forward runs in bf16 autocast,
optionally compiled.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from rlfarm.reward_fitting.collect import LabeledFrames
from rlfarm.rewards.fit_steps import descend, held_out_metrics
from rlfarm.rewards.fitted import FittedReward


@dataclass
class FitResult:
    """held_out: metrics of the kept epoch on the held-out frames (in the target's units); predictions: the kept
    network's scores of the held-out frames; curve: per epoch train and held-out standardized MSE."""

    held_out: dict
    train_frames: int
    held_out_index: np.ndarray
    predictions: np.ndarray
    best_epoch: int
    seconds: float
    curve: list[dict] = field(default_factory=list)


def split_by_episode(episode: np.ndarray, holdout: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train index, held-out index): a random `holdout` fraction of the episodes, at least one, held out."""
    episodes = np.unique(episode)
    if len(episodes) < 2:
        raise ValueError("need frames from at least 2 episodes to hold some out; collect more frames")
    rng = np.random.default_rng(seed)
    count = min(max(1, round(holdout * len(episodes))), len(episodes) - 1)
    held = np.isin(episode, rng.choice(episodes, size=count, replace=False))
    return np.flatnonzero(~held), np.flatnonzero(held)


def fit(net: FittedReward, data: LabeledFrames, epochs: int, batch_size: int, lr: float, weight_decay: float,
        holdout: float, device: str = "cpu", seed: int = 0, compile: bool = False) -> FitResult:
    """Train `net` in place (the best epoch's weights are loaded at the end) and score the held-out frames."""
    started = time.monotonic()
    torch.manual_seed(seed)
    train_index, held_index = split_by_episode(data.episode, holdout, seed)
    device = torch.device(device)
    net.to(device)
    mean, std = float(data.targets[train_index].mean()), float(data.targets[train_index].std())
    net.set_target_stats(mean, std)
    standardized = torch.from_numpy((data.targets - mean) / max(std, 1e-6)).float()
    features = _cached_features(net, data.frames, device, batch_size) if net.cache_features else None
    if features is not None:
        net.init_head(features[torch.from_numpy(train_index)].to(device), standardized[train_index].to(device))
    head = torch.compile(net.head) if compile and device.type == "cuda" else net.head
    trained = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=lr, weight_decay=weight_decay)
    steps = epochs * math.ceil(len(train_index) / batch_size)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, max(steps, 1))
    rng = np.random.default_rng(seed)

    def standardized_scores(index: np.ndarray) -> torch.Tensor:
        x = features[torch.from_numpy(index)].to(device) if features is not None else net.features(_frames(data, index, device))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            return head(x).float()

    def held_out_mse() -> float:
        net.eval()
        with torch.no_grad():
            scores = torch.cat([standardized_scores(i).cpu() for i in np.array_split(held_index, _parts(held_index, batch_size))])
        net.train()
        return float(F.mse_loss(scores, standardized[held_index]))

    best = (held_out_mse(), 0, _trained_copy(net))
    curve = [{"epoch": 0, "train_mse": None, "held_out_mse": best[0]}]
    net.train()
    for epoch in range(1, epochs + 1):
        losses = []
        for batch in np.array_split(rng.permutation(train_index), _parts(train_index, batch_size)):
            loss = descend(optimizer, standardized_scores(batch), standardized[batch].to(device))
            schedule.step()
            losses.append(loss.item())
        held = held_out_mse()
        curve.append({"epoch": epoch, "train_mse": float(np.mean(losses)), "held_out_mse": held})
        if held < best[0]:
            best = (held, epoch, _trained_copy(net))
    net.load_state_dict(best[2], strict=False)  # the trained tensors; a frozen tower never changed
    net.eval()
    predictions = score(net, data.frames[held_index], device, batch_size)
    return FitResult(held_out_metrics(predictions, data.targets[held_index]), len(train_index), held_index,
                     predictions, best[1], round(time.monotonic() - started, 2), curve)


def score(net: FittedReward, frames: np.ndarray, device, batch_size: int = 256) -> np.ndarray:
    """The network's rewards for frames [n, S, S, 3k] uint8, as the labelers compute them. Returns [n] float32."""
    return _batched(net, frames, device, batch_size).numpy()


def _trained_copy(net: FittedReward) -> dict[str, torch.Tensor]:
    """A copy of what the fit changes (not a frozen tower: a ViT-L's weights are over a GB)."""
    return {k: v.detach().clone() for k, v in net.trained_state().items()}


def _cached_features(net: FittedReward, frames: np.ndarray, device, batch_size: int) -> torch.Tensor:
    """Frozen features of every frame, on CPU (moved to the device per minibatch)."""
    return _batched(net.features, frames, device, batch_size)


@torch.no_grad()
def _batched(fn, frames: np.ndarray, device, batch_size: int) -> torch.Tensor:
    """fn over frames in minibatches on the device (bf16 autocast on CUDA); the results float32, on CPU."""
    device = torch.device(device)
    out = []
    for start in range(0, len(frames), batch_size):
        batch = torch.from_numpy(np.ascontiguousarray(frames[start:start + batch_size])).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            out.append(fn(batch).float().cpu())
    return torch.cat(out) if out else torch.empty(0)


def _frames(data: LabeledFrames, index: np.ndarray, device) -> torch.Tensor:
    return torch.from_numpy(data.frames[index]).to(device)


def _parts(index: np.ndarray, batch_size: int) -> int:
    return max(1, math.ceil(len(index) / batch_size))

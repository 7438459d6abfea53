"""What fitting a reward network to labels needs at each step, shared by `rlfarm fit-reward` (rlfarm/reward_fitting/fit.py)
and the distilled reward's online student (rlfarm/rewards/distilled.py): the loss step on standardized targets and
the held-out metrics. It lives among the rewards, below both, so that a reward model trained in the labeler does not
import the fitting command's package."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def descend(optimizer: torch.optim.Optimizer, scores: torch.Tensor, standardized_targets: torch.Tensor) -> torch.Tensor:
    """One optimizer step on the fit's loss: the MSE of the head's scores against the standardized targets (both
    [n], float32). Returns the loss, detached (reading it is the caller's choice: on CUDA it waits for the step)."""
    loss = F.mse_loss(scores, standardized_targets)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()


def held_out_metrics(predicted: np.ndarray, true: np.ndarray) -> dict:
    """MSE, MAE, R² (1 − MSE / variance of the truth), Pearson and Spearman correlation, in the target's units
    (the correlations NaN where either side is constant)."""
    error = predicted.astype(np.float64) - true
    variance = float(np.var(true))
    varied = len(true) > 1 and np.std(predicted) > 0 and variance > 0
    correlation = float(np.corrcoef(predicted, true)[0, 1]) if varied else float("nan")
    mse = float(np.mean(error**2))
    return {"frames": int(len(true)), "mse": mse, "mae": float(np.mean(np.abs(error))),
            "r2": 1 - mse / variance if variance > 0 else float("nan"), "pearson": correlation,
            "spearman": rank_correlation(predicted, true) if varied else float("nan"),
            "target_mean": float(np.mean(true)), "target_std": float(np.std(true))}


def rank_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rho: the Pearson correlation of the two arrays' ranks, tied values sharing their mean rank (a bf16
    student's scores tie often, a thresholded teacher's labels mostly: ranks broken by position would count the
    arrays' order, not their agreement)."""
    return float(np.corrcoef(*(_mean_ranks(x) for x in (a, b)))[0, 1])


def _mean_ranks(x: np.ndarray) -> np.ndarray:
    _, inverse, counts = np.unique(np.asarray(x).reshape(-1), return_inverse=True, return_counts=True)
    first = np.cumsum(counts) - counts  # the rank of each distinct value's first copy, from 0
    return (first + (counts - 1) / 2)[inverse].astype(np.float64)

"""What `rlfarm fit-reward` shows of a fit: report.json (held-out error, per-epoch curve, where the frames came
from), calibration.png (predicted vs true reward on the held-out frames, with binned means) and frames.png
(held-out frames spanning the target's range, each with its true and predicted reward)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from rlfarm.reward_fitting.collect import LabeledFrames
from rlfarm.reward_fitting.fit import FitResult


def calibration_bins(predicted: np.ndarray, true: np.ndarray, bins: int = 10) -> list[dict]:
    """Held-out frames in `bins` equal-count bins of the true reward: each bin's mean true and predicted reward."""
    order = np.argsort(true, kind="stable")
    return [{"true": float(true[part].mean()), "predicted": float(predicted[part].mean()), "frames": int(len(part))}
            for part in np.array_split(order, min(bins, len(order))) if len(part)]


def write_fit_report(out: Path, data: LabeledFrames, result: FitResult, details: dict, report_frames: int = 12,
                     dpi: int = 100) -> dict:
    """report.json, calibration.png and frames.png in `out`. Returns report.json's content."""
    true = data.targets[result.held_out_index]
    report = {**details, "held_out": result.held_out, "train_frames": result.train_frames,
              "best_epoch": result.best_epoch, "fit_s": result.seconds, "curve": result.curve,
              "calibration": calibration_bins(result.predictions, true),
              "figures": [plot_calibration(out / "calibration.png", result.predictions, true, result.held_out, dpi).name,
                          plot_frames(out / "frames.png", data.frames[result.held_out_index], true, result.predictions,
                                      report_frames, dpi).name]}
    return report


def plot_calibration(path: Path, predicted: np.ndarray, true: np.ndarray, metrics: dict, dpi: int) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.8, 4.2))
    ax.scatter(true, predicted, s=4, alpha=0.25, color="tab:blue", lw=0, label="held-out frames")
    bins = calibration_bins(predicted, true)
    ax.plot([b["true"] for b in bins], [b["predicted"] for b in bins], "o-", color="tab:orange", ms=4,
            label="binned means")
    low, high = float(min(true.min(), predicted.min())), float(max(true.max(), predicted.max()))
    ax.plot([low, high], [low, high], "--", color="0.4", lw=1, label="perfect")
    ax.set_xlabel("true reward")
    ax.set_ylabel("predicted reward")
    ax.set_title(f"held out: R² {metrics['r2']:.3f}, MAE {metrics['mae']:.3g}", fontsize=10)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def plot_frames(path: Path, frames: np.ndarray, true: np.ndarray, predicted: np.ndarray, count: int, dpi: int) -> Path:
    """`count` frames at evenly spaced quantiles of the true reward, lowest first (of a stack, the newest render)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    count = max(1, min(count, len(frames)))
    order = np.argsort(true, kind="stable")
    picks = order[np.linspace(0, len(order) - 1, count).round().astype(int)]
    columns = min(count, 6)
    rows = -(-count // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(1.9 * columns, 2.1 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, i in zip(axes.flat, picks):
        ax.imshow(frames[i][..., -3:])  # the newest render of a stack
        ax.set_title(f"true {true[i]:.2f}\npred {predicted[i]:.2f}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path

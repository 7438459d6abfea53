"""Metric names → dashboard tags, one grouping for every sink that groups (TensorBoard, W&B)."""
from __future__ import annotations


def metric_tag(key: str) -> str:
    """Group scalars in TensorBoard and W&B: rates, losses and the rest."""
    if key.endswith("_per_s"):
        return f"throughput/{key}"
    if key.endswith("_loss") or key in ("alpha", "entropy"):
        return f"loss/{key}"
    return f"train/{key}"

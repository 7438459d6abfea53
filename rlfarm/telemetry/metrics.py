"""Metrics sinks: one JSON line per row in metrics.jsonl (always), TensorBoard scalars and W&B (optional)."""
from __future__ import annotations

import json
import math
from pathlib import Path


class MetricsLogger:
    """run_dir: where metrics.jsonl (and tb/, wandb/) go. wandb: keyword arguments for
    rlfarm.telemetry.wandb_sink.WandbSink (project, mode, config, ...), None for no W&B sink."""

    def __init__(self, run_dir: Path, tensorboard: bool = True, step_key: str = "env_steps", wandb: dict | None = None):
        self.step_key = step_key
        # W&B first: a missing package must fail before metrics.jsonl exists, so the empty run dir is discarded.
        self.wandb = None
        if wandb is not None:
            from rlfarm.telemetry.wandb_sink import WandbSink

            self.wandb = WandbSink(run_dir, step_key=step_key, **wandb)
        self.path = Path(run_dir) / "metrics.jsonl"
        self.file = self.path.open("a", buffering=1)  # line-buffered: a crash loses at most one row
        self.tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            self.tb = SummaryWriter(log_dir=str(Path(run_dir) / "tb"))

    def log(self, row: dict) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        self.file.write(json.dumps(clean) + "\n")
        if self.tb is not None:
            step = int(row.get(self.step_key, 0))
            for key, value in row.items():
                if key != self.step_key and isinstance(value, (int, float)) and not isinstance(value, bool) \
                        and value is not None and math.isfinite(value):
                    self.tb.add_scalar(metric_tag(key), value, step)
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in clean.items() if v is not None})

    def close(self) -> None:
        self.file.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.close()


def metric_tag(key: str) -> str:
    """Group scalars in TensorBoard and W&B: rates, losses and the rest."""
    if key.endswith("_per_s"):
        return f"throughput/{key}"
    if key.endswith("_loss") or key in ("alpha", "entropy"):
        return f"loss/{key}"
    return f"train/{key}"


def read_metrics(path: Path) -> list[dict]:
    with Path(path).open() as f:
        return [json.loads(line) for line in f if line.strip()]

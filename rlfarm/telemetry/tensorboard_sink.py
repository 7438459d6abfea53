"""TensorBoard sink (`logger.tensorboard: true`): each row's numbers as scalars under <run_dir>/tb."""
from __future__ import annotations

import math
from pathlib import Path

from rlfarm.telemetry.tags import metric_tag


class TensorBoardSink:
    """Scalars at step row[step_key]; booleans, text and None (a value not available this row) are skipped."""

    def __init__(self, run_dir: str | Path, step_key: str = "env_steps"):
        from torch.utils.tensorboard import SummaryWriter

        self.step_key = step_key
        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / "tb"))

    def log(self, row: dict) -> None:
        step = int(row.get(self.step_key, 0))
        for key, value in row.items():
            if key != self.step_key and isinstance(value, (int, float)) and not isinstance(value, bool) \
                    and math.isfinite(value):
                self.writer.add_scalar(metric_tag(key), value, step)

    def close(self) -> None:
        self.writer.close()

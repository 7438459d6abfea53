"""The metric sinks a run's `logger` config asks for, beside metrics.jsonl (which MetricsLogger always writes).
A sink has `log(row)` (row: metric name → value, None where a value is not available) and `close()`."""
from __future__ import annotations

from pathlib import Path

from rlfarm.telemetry.tensorboard_sink import TensorBoardSink
from rlfarm.telemetry.wandb_sink import WandbSink, wandb_options


def build_sinks(run_dir: str | Path, cfg, step_key: str = "env_steps") -> list:
    """W&B when `cfg.logger.wandb` is set, TensorBoard when `cfg.logger.tensorboard`. W&B first: a missing
    package fails before any other sink writes into the run directory."""
    sinks: list = []
    options = wandb_options(cfg)
    if options is not None:
        sinks.append(WandbSink(run_dir, step_key=step_key, **options))
    if cfg.logger.tensorboard:
        sinks.append(TensorBoardSink(run_dir, step_key))
    return sinks

"""One Run = its output directory (Hydra's run dir): resolved config, train.log (Hydra's job log),
metrics.jsonl, TensorBoard events, checkpoints/, and summary.json written last, atomically.

A run directory is complete only when summary.json exists; a failed run gets status.json with the error
instead, and a run that failed before it started (bad input) leaves no directory behind.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlfarm.telemetry.metrics import MetricsLogger


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=float) + "\n")
    os.replace(tmp, path)


class Run:
    def __init__(self, cfg: DictConfig, directory: str | Path):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_dir = self.dir / "checkpoints"
        self.checkpoint_dir.mkdir(exist_ok=True)
        (self.dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        self.metrics = MetricsLogger(self.dir, tensorboard=bool(cfg.logger.tensorboard))

    def log(self, row: dict) -> None:
        self.metrics.log(row)

    def finish(self, summary: dict) -> None:
        self.metrics.close()
        write_json_atomic(self.dir / "summary.json", summary)

    def fail(self, error: str) -> None:
        self.metrics.close()
        write_json_atomic(self.dir / "status.json", {"status": "failed", "error": error})


def discard_run_dir(directory: str | Path) -> None:
    """Remove a run directory that holds nothing of value (the run failed before it started)."""
    directory = Path(directory)
    if directory.is_dir() and not (directory / "metrics.jsonl").exists():
        shutil.rmtree(directory, ignore_errors=True)

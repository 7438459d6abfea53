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

from rlfarm.checkpoint_files import newest_first, newest_intact
from rlfarm.families import current_name, family_of
from rlfarm.telemetry.metrics import MetricsLogger
from rlfarm.telemetry.sinks import build_sinks


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=float) + "\n")
    os.replace(tmp, path)


class Run:
    """`family`: the config's family record (rlfarm/families.py): its step key orders the metrics rows; the loop's
    live view shows its columns."""

    def __init__(self, cfg: DictConfig, directory: str | Path):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_dir = self.dir / "checkpoints"
        self.checkpoint_dir.mkdir(exist_ok=True)
        (self.dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        self.family = family_of(cfg)
        self.step_key = self.family.step_key
        # the sinks first: a missing W&B package must fail before metrics.jsonl exists, so the run dir is discarded
        self.metrics = MetricsLogger(self.dir, build_sinks(self.dir, cfg, self.step_key), self.step_key)

    def truncate_metrics(self, after_step: int) -> None:
        """On resume: drop rows logged after the checkpoint (their step, `step_key`, is past `after_step`),
        so steps never repeat in metrics.jsonl."""
        self.metrics.truncate(after_step)

    def log(self, row: dict) -> None:
        self.metrics.log(row)

    def finish(self, summary: dict) -> None:
        self.metrics.close()
        write_json_atomic(self.dir / "summary.json", summary)
        (self.dir / "status.json").unlink(missing_ok=True)  # a resumed run is no longer "preempted"

    def fail(self, error: str, status: str = "failed", **details) -> None:
        self.metrics.close()
        write_json_atomic(self.dir / "status.json", {"status": status, "error": error, **details})


def saved_config(run_dir: str | Path) -> DictConfig:
    """The config a run saved (config.yaml), its family called by today's name (a run saved before a family was
    renamed still resumes)."""
    saved = OmegaConf.load(Path(run_dir) / "config.yaml")
    saved.algo.family = current_name(saved.algo.family)
    return saved


def newest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest checkpoint on disk, unverified (for messages: "a resume continues from ...")."""
    checkpoints = newest_first(Path(run_dir) / "checkpoints")
    return checkpoints[0] if checkpoints else None


def resume_checkpoint(run_dir: str | Path) -> Path | None:
    """The checkpoint a resume loads: the newest intact one, each newer damaged one named in a warning line;
    None when the run has none. Checked here, in the driver, so a damaged file never reaches a role's load."""
    return newest_intact(Path(run_dir) / "checkpoints", "resuming from",
                         "start a new run (without resume=), or pass resume=<another run dir>")


def is_run_dir(path: str | Path) -> bool:
    path = Path(path)
    return (path / "config.yaml").is_file() and (path / "checkpoints").is_dir()


def discard_run_dir(directory: str | Path) -> None:
    """Remove a run directory that holds nothing of value (the run failed before it started)."""
    directory = Path(directory)
    if directory.is_dir() and not (directory / "metrics.jsonl").exists():
        shutil.rmtree(directory, ignore_errors=True)

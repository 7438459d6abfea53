"""Weights & Biases sink (`logger=wandb`): the rows of metrics.jsonl, with env_steps as their x axis.

wandb is optional: it is imported when the sink is made, and a missing package is one clear line. The default
mode is offline (files under <run_dir>/wandb/, upload later with `wandb sync <run_dir>/wandb/offline-run-*`),
so a run never waits on the network. wandb's console capture is off: it would fight the rich live view.
Rows are logged with `env_steps` as a defined step metric rather than as wandb's own step, because several
rows can share one env_steps value (acting paused by backpressure) and wandb drops non-increasing steps.
"""
from __future__ import annotations

from pathlib import Path

from rlfarm.errors import RlfarmError
from rlfarm.telemetry.tags import metric_tag

MISSING = "logger=wandb needs `pip install wandb`"


def require_wandb():
    """The wandb module, or RlfarmError with the install line (call it in preflight to fail before a run starts)."""
    try:
        import wandb
    except ImportError:
        raise RlfarmError(MISSING) from None
    return wandb


def wandb_options(cfg) -> dict | None:
    """Keyword arguments for WandbSink from a run's config: None unless cfg.logger.wandb is set."""
    from omegaconf import OmegaConf

    options = cfg.logger.get("wandb")
    if not options:
        return None
    return {**OmegaConf.to_container(options, resolve=True), "config": OmegaConf.to_container(cfg, resolve=True)}


class WandbSink:
    """project, mode ("offline" | "online" | "disabled"), config (the run's resolved config), name (default: the
    run directory's name); any other key is passed to wandb.init (entity, group, tags, notes, ...)."""

    def __init__(self, run_dir: str | Path, step_key: str = "env_steps", project: str = "rlfarm", mode: str = "offline",
                 config: dict | None = None, name: str | None = None, **init_kwargs):
        wandb = require_wandb()
        self.step_key = step_key
        settings = wandb.Settings(console="off", quiet=True, x_disable_stats=True)
        self.run = wandb.init(project=project, mode=mode, dir=str(run_dir), config=config,
                              name=name or Path(run_dir).name, settings=settings, **init_kwargs)
        self.run.define_metric(step_key)
        self.run.define_metric("*", step_metric=step_key)

    def log(self, row: dict) -> None:
        """row: metric name → number (None for a value that is not available this row; dropped)."""
        scalars = {(k if k == self.step_key else metric_tag(k)): v for k, v in row.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        self.run.log(scalars)

    def close(self) -> None:
        self.run.finish()

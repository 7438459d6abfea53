"""`rlfarm train`: compose, validate, place the roles, run the family's loop, write the run directory."""
from __future__ import annotations

import logging

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from rlfarm.cli import fail
from rlfarm.cluster import ray_session
from rlfarm.commands.common import check_local_cluster, compose_checked
from rlfarm.config import validate
from rlfarm.errors import RlfarmError
from rlfarm.run import Run, discard_run_dir
from rlfarm.telemetry.summary import summary_paragraph
from rlfarm.topology import PlacedTopology, plan_topology

log = logging.getLogger("rlfarm")


def preflight(config_name: str, args: list[str]) -> None:
    check_local_cluster(compose_checked(config_name, args), args)


def task(cfg: DictConfig) -> dict:
    run_dir = HydraConfig.get().runtime.output_dir
    try:
        validate(cfg)
        plan = plan_topology(cfg.topology)
    except RlfarmError as error:
        discard_run_dir(run_dir)
        fail(error)
    run = None
    try:
        with ray_session(cfg.ray, plan):
            placed = PlacedTopology(plan, float(cfg.ray.ready_timeout_s))
            run = Run(cfg, run_dir)
            summary = train_family(cfg, run, placed)
    except KeyboardInterrupt:
        if run is not None:
            run.fail("interrupted")
        fail("interrupted", code=130)
    except Exception as error:  # any failure: one line on screen, the traceback in train.log
        log.debug("run failed", exc_info=True)
        error = _innermost(error)
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if run is None:
            discard_run_dir(run_dir)
        else:
            run.fail(message)
        fail(message if isinstance(error, RlfarmError) else f"{type(error).__name__}: {message}")
    log.info(summary_paragraph(cfg, summary, run_dir))
    return summary


def _innermost(error: BaseException) -> BaseException:
    """Hydra wraps a target's exception (InstantiationException); the cause is what the user must read."""
    while error.__cause__ is not None and not isinstance(error, RlfarmError):
        error = error.__cause__
    return error


def train_family(cfg: DictConfig, run: Run, placed: PlacedTopology) -> dict:
    if cfg.algo.family == "offpolicy":
        from rlfarm.loops.offpolicy import OffPolicyLoop

        loop = OffPolicyLoop(cfg, run, placed)
        summary = loop.train()
        if cfg.run.checkpoint:
            summary["checkpoint"] = loop.checkpoint()
        run.finish(summary)
        return summary
    raise RlfarmError(f"algo family '{cfg.algo.family}' has no training loop yet", "use algo=sac")

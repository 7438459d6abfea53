"""`rlfarm train`: compose, validate, place the roles, run the family's loop, write the run directory."""
from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from rlfarm.cli import fail
from rlfarm.cluster import ray_session
from rlfarm.commands.common import check_local_cluster, compose_checked
from rlfarm.commands.resume import fresh_run_dir, redirect_resume, resolve_resume  # noqa: F401 - redirect_resume: rlfarm.cli calls it
from rlfarm.config import validate
from rlfarm.config.probes import probe_reward
from rlfarm.errors import ConfigError, Preempted, RlfarmError
from rlfarm.families import family_of
from rlfarm.mps import check_mps, mps_daemon
from rlfarm.run import Run, discard_run_dir, is_run_dir
from rlfarm.topology import PlacedTopology, plan_topology

log = logging.getLogger("rlfarm")

PREEMPTED_EXIT = 75  # EX_TEMPFAIL: "try again": a checkpoint was written, rerun with resume=auto
INTERRUPTED_EXIT = 130  # Ctrl-C (128 + SIGINT), after the checkpoint the first one asks for


def preflight(config_name: str, args: list[str]) -> None:
    cfg = compose_checked(config_name, args, probe_reward)  # a reward module of one's own: built, run on a probe
    if cfg.resume not in (None, "auto") and not is_run_dir(cfg.resume):
        raise ConfigError(f"resume={cfg.resume} is not a run directory (no config.yaml and checkpoints/ there)",
                          "pass the directory of an earlier rlfarm run, or resume=auto")
    family = family_of(cfg)  # what is asked of the topology, before whether the cluster holds it
    family.check_plan(cfg, plan_topology(cfg.topology, family))
    check_mps(cfg)  # before the cluster: a joined one cannot take the run's own daemon
    check_local_cluster(cfg, args)


def task(cfg: DictConfig) -> dict:
    run_dir = HydraConfig.get().runtime.output_dir
    if HydraConfig.get().job.get("num", 0):  # a sweep's later job: its "first env step" counts from now
        from rlfarm.loops.offpolicy_metrics import job_started  # (imports Ray: not for a refused command)

        job_started(time.time())
    if (Path(run_dir) / "summary.json").exists():
        if cfg.resume is None:  # never overwrite a finished run
            fail(ConfigError(f"{run_dir} already holds a finished run (summary.json)",
                             "pick another hydra.run.dir, or resume=auto to accept it as done"))
        log.info("%s already holds a finished run (summary.json); nothing to resume", run_dir)
        return json.loads((Path(run_dir) / "summary.json").read_text())
    try:
        cfg, resume_from = resolve_resume(cfg, run_dir)
        if resume_from is None:
            run_dir = fresh_run_dir(run_dir)
        validate(cfg)
        family = family_of(cfg)
        plan = plan_topology(cfg.topology, family)
        family.check_plan(cfg, plan)
    except RlfarmError as error:
        if resume_from_dir_is_new(cfg, run_dir):
            discard_run_dir(run_dir)
        fail(error)
    run = None
    try:
        with mps_daemon(cfg, run_dir), ray_session(cfg.ray, plan, float(cfg.run.restart_timeout_s)):
            placed = PlacedTopology(plan, float(cfg.ray.ready_timeout_s))
            run = Run(cfg, run_dir)
            summary = train_family(cfg, run, placed, resume_from)
    except Preempted as preempted:
        run.fail(str(preempted), status="interrupted" if preempted.interrupted else "preempted",
                 checkpoint=preempted.checkpoint)
        fail(str(preempted), code=INTERRUPTED_EXIT if preempted.interrupted else PREEMPTED_EXIT)
    except KeyboardInterrupt:  # before the loop ran, or a second Ctrl-C
        if run is not None:
            run.fail("interrupted")
        fail("interrupted", code=INTERRUPTED_EXIT)
    except Exception as error:  # any failure: one line on screen, the traceback in train.log
        log.debug("run failed", exc_info=True)
        message = failure_line(error)
        if run is not None:
            run.fail(message)
        elif resume_from_dir_is_new(cfg, run_dir):  # a resumed run failing before its Run (Ray, MPS) keeps its dir
            discard_run_dir(run_dir)
        fail(message)
    log.info(family.closing_paragraph(cfg, summary, run_dir))
    return summary


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def failure_line(error: BaseException) -> str:
    """The one line a failed run prints and writes to status.json, without terminal colours. Hydra wraps a
    target's exception (InstantiationException): the cause is what the user must read. A role whose constructor
    raised reaches the driver as Ray's ActorDiedError, its message the role's traceback: its last line is the
    role's own error, named with the role."""
    while error.__cause__ is not None and not isinstance(error, RlfarmError):
        error = error.__cause__
    text = ANSI.sub("", str(error)).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if getattr(error, "actor_init_failed", False) and len(lines) > 1:
        role = re.search(r"ray::(\w+)\.__init__", text)
        return f"{role.group(1) if role else 'a role'} could not start: {lines[-1]}"
    message = lines[0] if lines else type(error).__name__
    return message if isinstance(error, RlfarmError) else f"{type(error).__name__}: {message}"


def check_labels(summary: dict) -> None:
    """A run whose every transition was quarantined learned nothing: it fails, naming the reward model's error."""
    quarantined = summary.get("transitions_quarantined") or 0
    if quarantined and not summary.get("transitions_labeled"):
        raise RlfarmError(f"the reward model failed on every transition: all {quarantined:,} were quarantined, 0 "
                          f"labeled (last error: {summary.get('reward_last_error') or 'unknown'})",
                          "see quarantine/*.json in the run dir and fix the reward model")


def resume_from_dir_is_new(cfg: DictConfig, run_dir: str) -> bool:
    """Never delete a directory that holds an earlier run (resume)."""
    return not is_run_dir(run_dir)


def train_family(cfg: DictConfig, run: Run, placed: PlacedTopology, resume_from: str | None = None) -> dict:
    """Run the family's loop. Every loop takes `resume_from` and checkpoints on SIGTERM (Slurm sends it before it
    kills a job: exit PREEMPTED_EXIT) and on the first Ctrl-C (exit INTERRUPTED_EXIT)."""
    loop = run.family.loop_class()(cfg, run, placed, resume_from)
    with loop.stopping_on_signals():
        summary = loop.train()
        check_labels(summary)
        if cfg.run.checkpoint:
            summary["checkpoint"] = loop.checkpoint()
    run.finish(summary)
    return summary

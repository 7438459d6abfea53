"""`rlfarm train`: compose, validate, place the roles, run the family's loop, write the run directory."""
from __future__ import annotations

import importlib
import json
import logging
import signal
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from rlfarm.cli import fail
from rlfarm.cluster import ray_session
from rlfarm.commands.common import check_local_cluster, compose_checked
from rlfarm.config import validate
from rlfarm.errors import ConfigError, Preempted, RlfarmError
from rlfarm.loops.llm_layout import check_rollout_layout
from rlfarm.run import Run, discard_run_dir, is_run_dir, resume_checkpoint
from rlfarm.telemetry.summary import onpolicy_paragraph, ppo_paragraph, summary_paragraph, vla_paragraph
from rlfarm.topology import PlacedTopology, plan_topology

log = logging.getLogger("rlfarm")


# Keys that only bound or place a run: on resume, the command line may change them (a longer budget, another
# cluster); everything else comes from the saved config.
RESUME_OVERRIDABLE = ("total_env_steps", "algo.max_updates", "run", "ray")
PREEMPTED_EXIT = 75  # EX_TEMPFAIL: "try again": a checkpoint was written, rerun with resume=auto


def preflight(config_name: str, args: list[str]) -> None:
    cfg = compose_checked(config_name, args)
    if cfg.resume not in (None, "auto") and not is_run_dir(cfg.resume):
        raise ConfigError(f"resume={cfg.resume} is not a run directory (no config.yaml and checkpoints/ there)",
                          "pass the directory of an earlier rlfarm run, or resume=auto")
    if cfg.algo.family == "onpolicy":  # what is asked of the topology, before whether the cluster holds it
        check_rollout_layout(cfg, plan_topology(cfg.topology, cfg.algo.family))
    check_local_cluster(cfg, args)


def redirect_resume(args: list[str]) -> list[str]:
    """resume=<run_dir> continues *in* that directory: make it Hydra's run dir too."""
    resume = next((a.split("=", 1)[1] for a in args if a.startswith("resume=")), None)
    if resume in (None, "auto", "null") or any(a.startswith("hydra.run.dir=") for a in args):
        return args
    return [*args, f"hydra.run.dir={resume}"]


def resolve_resume(cfg: DictConfig, run_dir: str) -> tuple[DictConfig, str | None]:
    """(config to run, checkpoint to resume from or None). A resumed run keeps its saved config, except for
    the keys that only bound or place the run (RESUME_OVERRIDABLE)."""
    if cfg.resume is None:
        return cfg, None
    checkpoint = resume_checkpoint(run_dir)  # the newest intact one; a damaged newer one is named
    if checkpoint is None:
        if cfg.resume == "auto":
            return cfg, None  # nothing to resume yet: a fresh start (first attempt of a requeued job)
        raise ConfigError(f"resume={cfg.resume}: the run directory has no checkpoint", "start a new run instead")
    saved = OmegaConf.load(Path(run_dir) / "config.yaml")
    saved.resume = cfg.resume
    # run.* keys added since the run was saved take today's defaults (saved values still win).
    saved.run = OmegaConf.merge(cfg.run, saved.get("run", {}))
    # Keys given on this command line that only bound or place the run win over the saved ones; any other would
    # change what the checkpoint was trained as (the algorithm, the learner's ranks): it is ignored, and said so.
    ignored = []
    for override in HydraConfig.get().overrides.task:
        key = override.split("=", 1)[0].lstrip("+~")
        if any(key == name or key.startswith(name + ".") for name in RESUME_OVERRIDABLE):
            OmegaConf.update(saved, key, OmegaConf.select(cfg, key), force_add=True)
        elif key != "resume" and OmegaConf.select(saved, key) != OmegaConf.select(cfg, key):
            ignored.append(override)
    if ignored:
        log.warning("resume keeps the run's saved config: ignored %s (on resume only %s can change; "
                    "start a new run to change the rest)", " ".join(ignored), ", ".join(RESUME_OVERRIDABLE))
    return saved, str(checkpoint)


def task(cfg: DictConfig) -> dict:
    run_dir = HydraConfig.get().runtime.output_dir
    if (Path(run_dir) / "summary.json").exists():
        if cfg.resume is None:  # never overwrite a finished run
            fail(ConfigError(f"{run_dir} already holds a finished run (summary.json)",
                             "pick another hydra.run.dir, or resume=auto to accept it as done"))
        log.info("%s already holds a finished run (summary.json); nothing to resume", run_dir)
        return json.loads((Path(run_dir) / "summary.json").read_text())
    try:
        cfg, resume_from = resolve_resume(cfg, run_dir)
        validate(cfg)
        plan = plan_topology(cfg.topology, cfg.algo.family)
        if cfg.algo.family == "onpolicy":
            check_rollout_layout(cfg, plan)
    except RlfarmError as error:
        if resume_from_dir_is_new(cfg, run_dir):
            discard_run_dir(run_dir)
        fail(error)
    run = None
    try:
        with ray_session(cfg.ray, plan):
            placed = PlacedTopology(plan, float(cfg.ray.ready_timeout_s))
            run = Run(cfg, run_dir, step_key="updates" if cfg.algo.family == "onpolicy" else "env_steps")
            summary = train_family(cfg, run, placed, resume_from)
    except Preempted as preempted:
        run.fail(str(preempted), status="preempted", checkpoint=preempted.checkpoint)
        fail(str(preempted), code=PREEMPTED_EXIT)
    except KeyboardInterrupt:
        if run is not None:
            run.fail("interrupted")
        fail("interrupted", code=130)
    except Exception as error:  # any failure: one line on screen, the traceback in train.log
        log.debug("run failed", exc_info=True)
        error = _innermost(error)
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        if run is None and resume_from_dir_is_new(cfg, run_dir):
            discard_run_dir(run_dir)
        else:
            run.fail(message)
        fail(message if isinstance(error, RlfarmError) else f"{type(error).__name__}: {message}")
    log.info(PARAGRAPHS[cfg.algo.family](cfg, summary, run_dir))
    return summary


def _innermost(error: BaseException) -> BaseException:
    """Hydra wraps a target's exception (InstantiationException); the cause is what the user must read."""
    while error.__cause__ is not None and not isinstance(error, RlfarmError):
        error = error.__cause__
    return error


def resume_from_dir_is_new(cfg: DictConfig, run_dir: str) -> bool:
    """Never delete a directory that holds an earlier run (resume)."""
    return not is_run_dir(run_dir)


# algo.family → (loop module, loop class). Every loop takes `resume_from` and checkpoints on SIGTERM.
LOOPS = {"offpolicy": ("rlfarm.loops.offpolicy", "OffPolicyLoop"),
         "onpolicy": ("rlfarm.loops.llm", "LLMLoop"),
         "onpolicy_env": ("rlfarm.loops.ppo", "PPOLoop"),
         "vla": ("rlfarm.loops.vla", "VLALoop")}
PARAGRAPHS = {"offpolicy": summary_paragraph, "onpolicy": onpolicy_paragraph, "onpolicy_env": ppo_paragraph,
              "vla": vla_paragraph}


def train_family(cfg: DictConfig, run: Run, placed: PlacedTopology, resume_from: str | None = None) -> dict:
    if cfg.algo.family not in LOOPS:
        raise RlfarmError(f"algo family '{cfg.algo.family}' has no training loop",
                          "use algo=sac, algo=ppo, algo=grpo or experiment=simplevla")
    module, name = LOOPS[cfg.algo.family]
    loop = getattr(importlib.import_module(module), name)(cfg, run, placed, resume_from)
    # Slurm sends SIGTERM before it kills a job: checkpoint and exit with PREEMPTED_EXIT.
    signal.signal(signal.SIGTERM, lambda *_: loop.request_preemption())
    summary = loop.train()
    if cfg.run.checkpoint:
        summary["checkpoint"] = loop.checkpoint()
    run.finish(summary)
    return summary

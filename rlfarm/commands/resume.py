"""`rlfarm train resume=<run_dir>`: continue a run in its own directory, as it was configured.

Before Hydra starts, `redirect_resume` puts the run's own overrides (Hydra's record of them, .hydra/overrides.yaml:
its algo, experiment and values) ahead of the ones typed now, so that the preflight and Hydra compose the resumed
run's config and check what is typed now against it: `resume=<a grpo run> algo.max_updates=80` names a key of
GRPO's, not of the default algorithm's. In the run, `resolve_resume` takes the saved config.yaml and lets only the
keys that bound or place the run (RESUME_OVERRIDABLE) change.

A run that resumes nothing (no resume=, or resume=auto where no checkpoint was written yet) never writes into the
files of an earlier run in its directory (a second metrics history appended to the first): `fresh_run_dir` starts
it in a new directory beside that one, and says so.
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from rlfarm.errors import ConfigError
from rlfarm.run import is_run_dir, resume_checkpoint, saved_config

log = logging.getLogger("rlfarm")

# Keys that only bound, place or pace a run: on resume, the command line may change them (a longer budget, another
# cluster, GPU sharing through MPS or not, when the engine captures its graphs); the rest comes from the saved config.
RESUME_OVERRIDABLE = ("total_env_steps", "algo.max_updates", "run", "ray", "topology.mps", "algo.engine_capture")


def override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def redirect_resume(args: list[str]) -> list[str]:
    """resume=<run_dir> continues *in* that directory, as configured there: the run's own overrides first (those
    typed now win), and the directory as Hydra's run dir."""
    at = next((i for i, arg in enumerate(args) if arg.startswith("resume=")), None)
    resume = None if at is None else args[at].split("=", 1)[1]
    if resume in (None, "auto", "null"):
        return args
    added = run_overrides(resume, args)
    if not any(arg.startswith("hydra.run.dir=") for arg in args):
        added.append(f"hydra.run.dir={resume}")
    return [*args[:at], *added, *args[at:]]  # beside resume=: Hydra reads the overrides as one run of arguments


def run_overrides(run_dir: str, typed: list[str]) -> list[str]:
    """The overrides the run in `run_dir` was started with, less those whose key is typed now (resume= among
    them); none where Hydra kept no record (not a run directory: the preflight says so)."""
    record = Path(run_dir).expanduser() / ".hydra" / "overrides.yaml"
    if not record.is_file():
        return []
    typed_keys = {override_key(arg) for arg in typed if not arg.startswith("-")}
    return [str(override) for override in OmegaConf.load(record) if override_key(str(override)) not in typed_keys]


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
    saved = saved_config(run_dir)
    saved.resume = cfg.resume
    # run.* keys added since the run was saved take today's defaults (saved values still win).
    saved.run = OmegaConf.merge(cfg.run, saved.get("run", {}))
    # Keys given on this command line that only bound or place the run win over the saved ones; any other would
    # change what the checkpoint was trained as (the algorithm, the learner's ranks): it is ignored, and said so.
    # The run's own overrides (redirect_resume) compose what was saved: they differ in nothing.
    ignored = []
    for override in HydraConfig.get().overrides.task:
        key = override_key(override)
        if any(key == name or key.startswith(name + ".") for name in RESUME_OVERRIDABLE):
            OmegaConf.update(saved, key, OmegaConf.select(cfg, key), force_add=True)
        elif key != "resume" and _plain(OmegaConf.select(saved, key)) != _plain(OmegaConf.select(cfg, key)):
            ignored.append(override)
    if ignored:
        log.warning("resume keeps the run's saved config: ignored %s (on resume only %s can change; "
                    "start a new run to change the rest)", " ".join(ignored), ", ".join(RESUME_OVERRIDABLE))
    return saved, str(checkpoint)


def fresh_run_dir(run_dir: str) -> str:
    """Where a run that resumes nothing writes: `run_dir`, unless an earlier run wrote there; then the first free
    `<run_dir>-2`, `-3`, ... with Hydra's record of this command (.hydra/) and its log (train.log) moved along."""
    if not is_run_dir(run_dir):
        return run_dir
    number = 2
    while Path(f"{run_dir}-{number}").exists():
        number += 1
    new = Path(f"{run_dir}-{number}")
    new.mkdir(parents=True)
    if (Path(run_dir) / ".hydra").is_dir():  # this command's, as Hydra just wrote it: `resume=<new>` reads it
        shutil.copytree(Path(run_dir) / ".hydra", new / ".hydra")
    _move_log_files(Path(run_dir), new)
    log.warning("%s holds an earlier run with no checkpoint to resume: this run starts over in %s (the earlier "
                "run's files are left as they are)", run_dir, new)
    return str(new)


def _move_log_files(old: Path, new: Path) -> None:
    """Hydra's file handlers writing into `old` (train.log) write the same file name in `new` from now on."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == old.resolve():
            moved = logging.FileHandler(new / Path(handler.baseFilename).name)
            moved.setLevel(handler.level)
            moved.setFormatter(handler.formatter)
            root.removeHandler(handler)
            handler.close()
            root.addHandler(moved)


def _plain(value):
    """A config node as plain values, resolved (a saved config.yaml was written resolved)."""
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value

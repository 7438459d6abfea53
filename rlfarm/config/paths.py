"""The paths a config names, checked before anything starts: every setting that names a file or a model folder
(rlfarm.schemas.PATH_SETTINGS), and the run directory Hydra will create. (Where config files are found:
rlfarm.config.search.)"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlfarm.errors import ConfigError
from rlfarm.schemas import PATH_SETTINGS, PATH_SETTINGS_BY_TARGET, PathKind


def looks_local(value: str) -> bool:
    return os.path.isabs(value) or value.startswith((".", "~"))


def check_paths(cfg: DictConfig) -> None:
    """Every setting that names a file or model (rlfarm.schemas.PATH_SETTINGS) names one of the right kind:
    a role that cannot open it would only die after Ray started."""
    for key, setting in PATH_SETTINGS.items():
        target = OmegaConf.select(cfg, f"{key.rsplit('.', 1)[0]}._target_", default=None)
        setting = PATH_SETTINGS_BY_TARGET.get((key, target), setting)
        value = OmegaConf.select(cfg, key, default=None)
        problem = None if value is None else path_problem(str(value), setting.kind)
        if problem:
            raise ConfigError(f"{key}: {problem}", f"set {key}=<{setting.wanted}>")


def path_problem(value: str, kind: PathKind) -> str | None:
    """Why `value` is not a `kind` (None when it is). A hub id (org/name, not local-looking) passes for a model."""
    if not value.strip():
        return f"blank ({value!r})"
    path = Path(os.path.expanduser(value))
    if kind is PathKind.file:
        if not path.exists():
            return f"no such file '{value}'"
        if not path.is_file():
            return f"'{value}' is a folder, not a file" if path.is_dir() else f"'{value}' is not a regular file"
        return f"'{value}' is an empty file" if path.stat().st_size == 0 else None
    if path.is_dir():
        return None if (path / "config.json").is_file() else \
            f"'{value}' has no config.json (not a folder written by save_pretrained)"
    if path.exists():
        return f"'{value}' is a file, not a model folder"
    return f"no such folder '{value}'" if looks_local(value) or value.count("/") > 1 else None  # hub id: org/name


def check_output_dir(key: str, value: str) -> None:
    """Fail before Hydra does (with a traceback) when the run directory `value` cannot be created.

    Only the part before the first ${...} is checked; a probe folder is made and removed again, because
    permission bits say nothing for root and nothing about /proc or read-only mounts."""
    static = value.split("${", 1)[0]
    if not static.strip():
        return
    target = Path(os.path.expanduser(static))
    if "${" in value and not static.endswith("/"):
        target = target.parent  # "runs/x_${now:...}": "x_" is only the start of a name
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"cannot create {key}={value}: '{existing}' is a file, not a folder",
                          f"set {key}=<a path in a writable folder>")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".rlfarm-write-check-", dir=existing))
    except OSError as error:
        raise ConfigError(f"cannot create {key}={value}: '{existing}' is not writable ({error.strerror})",
                          f"set {key}=<a path in a writable folder>") from None

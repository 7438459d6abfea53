"""Option handling shared by the commands that read a run directory (eval, report) rather than train one.

Their configs are flat option lists (conf/eval.yaml, conf/report.yaml). Each job they run writes only inside
the directory it reads (`hydra.run.dir` / `hydra.sweep.subdir` point there through the `rlfarm_abspath`
resolver), so no outputs/ or multirun/ folder appears where the command was typed.
"""
from __future__ import annotations

import itertools
import os

from omegaconf import DictConfig, OmegaConf

from rlfarm.commands.common import split_args
from rlfarm.config import compose
from rlfarm.errors import ConfigError

# An absolute path for hydra.sweep.subdir: os.path.join(sweep_dir, <absolute>) is the absolute path itself.
OmegaConf.register_new_resolver("rlfarm_abspath", lambda path: os.path.abspath(os.path.expanduser(str(path))),
                                replace=True)


def compose_jobs(config_name: str, args: list[str], example_key: str) -> list[DictConfig]:
    """One composed config per job the command line asks for (every combination of a -m sweep)."""
    overrides, multirun = split_args(args)
    bare = [o for o in overrides if "=" not in o]
    if bare:
        raise ConfigError(f"'{bare[0]}' is not an override", f"write rlfarm {config_name} {example_key}={bare[0]}")
    overrides = [o for o in overrides if not o.lstrip("+~").startswith("hydra")]
    configs = [compose(config_name, job) for job in (sweep_jobs(overrides) if multirun else [overrides])]
    for cfg in configs:
        missing = sorted(OmegaConf.missing_keys(cfg))
        if missing:
            raise ConfigError(f"{missing[0]} is required", f"pass {missing[0]}=<path>")
    return configs


def sweep_jobs(overrides: list[str]) -> list[list[str]]:
    """`run_dir=a,b episodes=3` → [[run_dir=a, episodes=3], [run_dir=b, episodes=3]]."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as error:
        raise ConfigError(f"cannot parse override: {str(error).splitlines()[0]}", "write overrides as key=value") from None
    choices = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override()
               else [o.input_line] for o in parsed]
    return [list(job) for job in itertools.product(*choices)]


def check_ints(cfg: DictConfig, **minimums: int) -> None:
    for key, minimum in minimums.items():
        value = cfg[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"{key} must be an integer >= {minimum}, got {value!r}", f"set {key}=<int >= {minimum}>")


def check_bools(cfg: DictConfig, *keys: str) -> None:
    for key in keys:
        if not isinstance(cfg[key], bool):
            raise ConfigError(f"{key} must be true or false, got {cfg[key]!r}", f"set {key}=true or {key}=false")

"""`rlfarm bench <name> [device=auto|cpu|cuda] [bench.<key>=...]`: run one bench, write bench.json, print a table.

The name is the first word after `bench` (or `bench=<name>`); it picks conf/bench/<name>.yaml and the module
rlfarm/bench/<name>.py, so a new bench plugs in by adding those two files. The measuring, ratios and
bench.json live in rlfarm/bench/common.py; this module checks the input before Hydra starts (bad name or
option → one line, exit 2, no run directory) and reports.
"""
from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from rlfarm.cli import fail
from rlfarm.commands.common import output_dir, split_args
from rlfarm.config import check_output_dir, compose, group_options
from rlfarm.errors import ConfigError, RlfarmError

log = logging.getLogger("rlfarm")

DEVICES = ("auto", "cpu", "cuda")


USAGE = "rlfarm bench <{names}> [device=auto|cpu|cuda] [bench.<key>=value ...]"
# The CLI prints errors with rich markup, which would swallow [...]: the one-line hint goes without brackets.
HINT = "rlfarm bench <{names}>, optionally device=auto|cpu|cuda and bench.<key>=value"


def rewrite_args(args: list[str]) -> list[str]:
    """`rlfarm bench learner device=cpu` → Hydra's `bench=learner device=cpu` (the name as a group choice)."""
    for position, arg in enumerate(args):
        if not arg.startswith("-") and "=" not in arg:
            return [*args[:position], f"bench={arg}", *args[position + 1:]]
    if {"--help", "-h"} & set(args) and not any(arg.startswith("bench=") for arg in args):
        # Hydra cannot show a config whose bench is not chosen yet: list the benches instead.
        print(USAGE.format(names="|".join(bench_names())))
        print("`rlfarm bench <name> --help` shows that bench's options.")
        raise SystemExit(0)
    return args


def bench_names() -> list[str]:
    """Benches that have both a config and a module."""
    return [name for name in group_options("bench") if importlib.util.find_spec(f"rlfarm.bench.{name}") is not None]


def preflight(config_name: str, args: list[str]) -> None:
    overrides, _ = split_args(args)
    names = bench_names()
    chosen = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "bench"]
    if len(chosen) > 1 or (chosen and "," in chosen[0]):
        raise ConfigError("one bench at a time", HINT.format(names="|".join(names)))
    if not chosen:
        raise ConfigError("which bench?", HINT.format(names="|".join(names)))
    if chosen[0] not in names:
        raise ConfigError(f"unknown bench '{chosen[0]}'", f"choose one of: {', '.join(names)}")
    cfg = compose(config_name, [o for o in overrides if not o.lstrip("+~").startswith("hydra")])
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"{missing[0]} is required but not set", f"pass {missing[0]}=<value>")
    if cfg.device not in DEVICES:
        raise ConfigError(f"device must be one of {'|'.join(DEVICES)}, got {cfg.device!r}", "set device=auto|cpu|cuda")
    from rlfarm.bench.common import resolve_device

    resolve_device(str(cfg.device))  # device=cuda on a machine without one fails here, not after Hydra starts
    check_output_dir(*output_dir(config_name, args, multirun=False))


def shown_command() -> str:
    """The command as the user typed it (the CLI turned the name into `bench=<name>` for Hydra)."""
    args = [arg.split("=", 1)[1] if arg.startswith("bench=") else arg for arg in sys.argv[1:]]
    return " ".join(["rlfarm bench", *args])


def task(cfg: DictConfig) -> dict:
    from rlfarm.bench.common import print_table, run_bench

    run_dir = HydraConfig.get().runtime.output_dir
    try:
        result = run_bench(cfg, run_dir, shown_command())
    except RlfarmError as error:
        fail(error)
    except Exception as error:  # one line on screen, the traceback in bench.log
        log.debug("bench failed", exc_info=True)
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        fail(f"{type(error).__name__}: {message}")
    print_table(result)
    log.info(f"bench {result['bench']} on {result['device_name']}: wrote {Path(run_dir) / 'bench.json'}")
    return result

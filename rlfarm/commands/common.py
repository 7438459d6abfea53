"""Shared steps of the commands: compose-and-validate before Hydra starts a run."""
from __future__ import annotations

from collections.abc import Callable

from omegaconf import DictConfig, OmegaConf

from rlfarm.cluster import cluster_address
from rlfarm.config.search import split_flags
from rlfarm.config import (CONF_DIR, check_known_keys, check_output_dir, check_schema_ranges, compose, sweep_variants,
                           validate)
from rlfarm.errors import ConfigError
from rlfarm.families import family_of
from rlfarm.topology import check_cluster, local_resources, plan_topology

MULTIRUN_FLAGS = {"-m", "--multirun"}


def split_args(args: list[str]) -> tuple[list[str], bool]:
    """(the overrides, whether -m): Hydra's flags, --config-dir's folder among them, are not overrides."""
    multirun = bool(MULTIRUN_FLAGS & set(args))
    overrides = [a for a in split_flags(args)[1] if not a.startswith("-")]
    return overrides, multirun


def compose_checked(config_name: str, args: list[str], *more: Callable[[DictConfig], None]) -> DictConfig:
    """train's config (and each sweep variant's): composed, validated, every key known, then the `more` checks;
    the run dir writable."""
    def check(cfg: DictConfig) -> None:
        validate(cfg)
        check_known_keys(cfg)
        for extra in more:
            extra(cfg)

    return compose_checked_with(config_name, args, check)


def compose_checked_with(config_name: str, args: list[str], check: Callable[[DictConfig], None]) -> DictConfig:
    """Compose the config (each sweep variant's with -m), required keys set and schema ranges met, then `check`
    it; the output directory must be creatable. Returns the first sweep point (or the only config)."""
    overrides, multirun = split_args(args)
    # hydra/* overrides only shape the launch, not the job's config: leave them to Hydra itself.
    overrides = [o for o in overrides if not o.lstrip("+~").startswith("hydra")]
    variants = sweep_variants(overrides) if multirun else [overrides]
    configs = [compose(config_name, variant) for variant in variants]
    for cfg in configs:
        missing = sorted(OmegaConf.missing_keys(cfg))
        if missing:
            raise ConfigError(f"{missing[0]} is required but not set", f"pass {missing[0]}=<value> on the command line")
        check_schema_ranges(cfg)
        check(cfg)
    check_output_dir(*output_dir(config_name, args, multirun))
    return configs[0]


def output_dir(config_name: str, args: list[str], multirun: bool) -> tuple[str, str]:
    """(key, unresolved value) of the directory Hydra will create: the last hydra.run.dir= (hydra.sweep.dir=
    for -m) override, else the config file's own. Hydra would fail on an unwritable one with a traceback."""
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    given = [a.split("=", 1)[1] for a in args if a.lstrip("+").startswith(f"{key}=")]
    if given:
        value = given[-1]
        return key, value[1:-1] if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"" else value
    raw = OmegaConf.to_container(OmegaConf.load(CONF_DIR / f"{config_name}.yaml"), resolve=False)
    for part in key.split("."):  # the unresolved string: ${now:...} and ${algo.name} resolve only inside Hydra
        raw = raw.get(part) if isinstance(raw, dict) else None
    return key, str(raw or "")


def launches_elsewhere(args: list[str]) -> bool:
    """A sweep sent to Slurm runs on other machines: this one's resources say nothing about them."""
    return any(a.lstrip("+").startswith("hydra/launcher=") and "local" not in a for a in args)


def check_local_cluster(cfg: DictConfig, args: list[str]) -> None:
    """The topology fits the private local cluster, or a cluster listens at ray.address (checked in seconds;
    the cluster's size is checked once joined). Skipped for a sweep sent to other machines."""
    plan = plan_topology(cfg.topology, family_of(cfg))
    if launches_elsewhere(args):
        return
    if cfg.ray.address:
        cluster_address(str(cfg.ray.address))
    else:
        check_cluster(plan, local_resources(cfg.ray.num_cpus, cfg.ray.num_gpus))

"""What Hydra cannot check while it composes, before a run starts: required keys, the schemas' ranges, the paths
a config names (rlfarm.config.paths), the rules across config groups of its algorithm family (the family record's
`rules`, rlfarm/config/family_rules.py; what only building can tell: rlfarm/config/probes.py), an env id, and every `_target_` (imported now,
as instantiate would, so a typo fails here and not in a Ray actor)."""
from __future__ import annotations

import difflib
import functools
import importlib
from dataclasses import is_dataclass

from omegaconf import DictConfig, OmegaConf

from rlfarm.config.paths import check_paths
from rlfarm.config.search import group_options, is_group
from rlfarm.errors import ConfigError
from rlfarm.families import family_of
from rlfarm.settings import RangeError


def check_schema_ranges(cfg: DictConfig, path: str = "") -> None:
    """Build every schema node into its dataclass, innermost first: their __post_init__ checks the ranges."""
    for key in cfg:
        child = cfg.get(key)
        if isinstance(child, DictConfig):
            check_schema_ranges(child, f"{path}{key}.")
    if not is_dataclass(OmegaConf.get_type(cfg)):
        return
    try:
        OmegaConf.to_object(cfg)
    except RangeError as error:
        key, choices = f"{path}{error.key}", error.allowed.removeprefix("one of ")
        raise ConfigError(f"{path}{error}", f"set {key}={choices}" if choices != error.allowed
                          else f"set {key} to a value {error.allowed}") from None


def validate(cfg: DictConfig) -> None:
    """What the schemas cannot say: the rules across config groups (its family's) and the paths a config names.
    Raises ConfigError (one line) on the first problem; imports the `_target_` modules last (they pull torch)."""
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"{missing[0]} is required but not set", f"pass {missing[0]}=<value> on the command line")
    check_schema_ranges(cfg)
    check_paths(cfg)
    family_of(cfg).check_config(cfg)
    check_targets(cfg)


def check_env_id(env_id: str, kwargs: DictConfig | None = None, imports=None) -> None:
    """A registered gymnasium id, or "module:Id" whose module registers it, after the modules of env.imports
    (imported here and, through the environment, in every process the run starts: rlfarm.envs.registry)."""
    from rlfarm.envs.registry import UnknownEnvError, registered_spec, use_env_modules

    try:
        use_env_modules(imports)
        registered_spec(env_id)
    except UnknownEnvError as error:
        raise ConfigError(error.problem, error.fix) from None
    if env_id.rpartition(":")[2] == "RlfarmAtari-v0":
        from rlfarm.envs.atari import check_game

        check_game(str((kwargs or {}).get("game", "Pong")))


# ---- _target_ nodes: imported as instantiate would (the run imports them next anyway)


def check_targets(cfg: DictConfig) -> None:
    """Every `_target_` in the config must name something importable; a typo fails here, not in a Ray actor."""
    for path, target in _targets(OmegaConf.to_container(cfg, resolve=False), ""):
        if not isinstance(target, str) or "${" in target:
            continue
        problem = locate_problem(target)
        if problem:
            group = path.split(".")[0] if path else ""
            pick = (f" or pick {group}={'|'.join(group_options(group))}"
                    if path == group and is_group(group) else "")
            raise ConfigError(f"{path + '.' if path else ''}_target_='{target}' {problem}",
                              f"set {path + '.' if path else ''}_target_=<module.Class>{pick}")


def _targets(node, path: str):
    if isinstance(node, dict):
        if "_target_" in node:
            yield path, node["_target_"]
        for key, value in node.items():
            yield from _targets(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _targets(value, f"{path}[{i}]")


@functools.lru_cache(maxsize=None)
def locate_problem(target: str) -> str | None:
    """Why `target` (a dotted module.attr path) cannot be located, or None when it can: the longest importable
    module prefix, then attributes, as hydra.utils.get_object does, with a close name when one is missing."""
    parts = target.split(".")
    if not all(part.isidentifier() for part in parts):
        return "is not a dotted Python path like package.module.Class"
    for depth in range(len(parts), 0, -1):
        module_name = ".".join(parts[:depth])
        try:
            found = importlib.import_module(module_name)
            break
        except ModuleNotFoundError as error:
            if error.name is None or not (module_name + ".").startswith(error.name + "."):
                return f"cannot be imported: {error}"  # the module exists; something it imports does not
        except Exception as error:
            return f"cannot be imported: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    else:
        return f"cannot be imported: no module named '{parts[0]}'"
    for attr in parts[depth:]:
        if not hasattr(found, attr):
            close = difflib.get_close_matches(attr, sorted(n for n in dir(found) if not n.startswith("_")), n=1)
            hint = f" (did you mean {module_name}.{close[0]}?)" if close else ""
            return f"cannot be imported: module '{module_name}' has no '{attr}'{hint}"
        found, module_name = getattr(found, attr), f"{module_name}.{attr}"
    return None

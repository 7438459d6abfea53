"""Keys nothing reads: Hydra's `+key=value` adds a key even to a schema node, where a typo would be ignored.
`check_known_keys` refuses such a key with the closest one that something reads."""
from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
from dataclasses import is_dataclass

from omegaconf import DictConfig, OmegaConf

from rlfarm.config.search import group_names, option_configs, repository
from rlfarm.config.validation import locate_problem
from rlfarm.errors import ConfigError
from rlfarm.schemas import FREE_FORM_KEYS

HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}


def check_known_keys(cfg: DictConfig) -> None:
    """Every key of a freshly composed train config is one that something reads: a schema's field, an argument
    of a `_target_`, a key some option of its config group sets, or one inside a free-form dict (a schema's
    Any-typed dict, rlfarm.schemas.FREE_FORM_KEYS). A new top-level key is the user's own note (kept in
    config.yaml, read by nothing), unless it is a near miss of a setting."""
    settings = _schema_fields(OmegaConf.get_type(cfg))
    for key in cfg:
        if key not in settings:
            close = difflib.get_close_matches(str(key), sorted(settings), n=1, cutoff=0.8)
            if close:
                raise ConfigError(f"unknown key '{key}': nothing reads it", f"did you mean {close[0]}? (a note of "
                                  "your own, kept in config.yaml, needs a name unlike any setting)")
            continue
        child = cfg._get_node(key)
        if isinstance(child, DictConfig):
            _check_keys(child, str(key), free=str(key) not in group_names())


def _check_keys(node: DictConfig, path: str, free: bool) -> None:
    """Refuse a key of `node` (at `path`) that nothing reads; `free`: a plain dict here holds data, not settings."""
    schema = OmegaConf.get_type(node)
    if is_dataclass(schema):
        readable = _schema_fields(schema)
    elif "_target_" in node:  # its arguments, and what conf/ sets there (a role may pop a key before instantiating)
        arguments = _target_arguments(node._get_node("_target_")._value())
        readable = None if arguments is None else arguments | _group_keys().get(path, set())
    else:
        readable = None if free or path in FREE_FORM_KEYS else _group_keys().get(path)
    if readable is None:
        return
    for key in node:
        if key not in readable:
            known = sorted(readable - HYDRA_KEYS)
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean {path}.{close[0]}?" if close else f"the keys of {path} are {', '.join(known)};"
            raise ConfigError(f"unknown key '{path}.{key}': nothing reads it", f"{hint} drop it or fix its spelling")
        child = node._get_node(key)
        if isinstance(child, DictConfig):  # a _target_'s arguments and a schema's Any-typed dicts are data
            _check_keys(child, f"{path}.{key}", free="_target_" in node or is_dataclass(schema))


def _schema_fields(schema: type) -> set[str]:
    return {field.name for field in dataclasses.fields(schema)}


def _target_arguments(target) -> set[str] | None:
    """The keyword arguments `target` takes (with Hydra's own keys); None: any (**kwargs, or not locatable)."""
    if not isinstance(target, str) or "${" in target or locate_problem(target):
        return None
    from hydra.utils import get_object

    try:
        parameters = inspect.signature(get_object(target)).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin)
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return {p.name for p in parameters} | HYDRA_KEYS


def _group_keys() -> dict[str, set[str]]:
    """dotted path → the keys some option of a config group (or an experiment) sets there, e.g. "topology.roles"
    → {learner, env_runner, labeler, engine}: the settings of groups that have no schema. Read from every folder
    on the search path (rlfarm.config.search: the user's own options too)."""
    return _keys_on(repository())


@functools.lru_cache(maxsize=4)
def _keys_on(_repository) -> dict[str, set[str]]:
    keys: dict[str, set[str]] = {}

    def collect(node, path: str) -> None:
        if isinstance(node, dict):
            keys.setdefault(path, set()).update(str(key) for key in node if key != "defaults")
            for key, value in node.items():
                collect(value, f"{path}.{key}")

    groups = group_names()
    for folder in (*groups, "experiment"):
        for _, config, is_global in option_configs(folder):
            tree = OmegaConf.to_container(config, resolve=False)
            if is_global:  # sets keys of several groups
                for group in groups & set(tree):
                    collect(tree[group], group)
            else:
                collect(tree, folder)
    return keys

"""Config composition checks that turn Hydra/OmegaConf failures and bad values into one clear line.

The config itself is plain Hydra: conf/ holds one directory per choice. `preflight` composes it once
with Hydra's compose API (before any run directory exists) so that an unknown option, an unknown key or
a bad value fails fast; `validate` checks values that Hydra cannot type-check.
"""
from __future__ import annotations

import difflib
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlfarm.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def compose(config_name: str, overrides: list[str]) -> DictConfig:
    """Compose conf/<config_name>.yaml with overrides, as `rlfarm <cmd>` would; errors become ConfigError."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return hydra_compose(config_name=config_name, overrides=overrides, return_hydra_config=False)
    except Exception as error:  # Hydra raises several exception types; each gets translated below
        raise _explain(error) from None
    finally:
        GlobalHydra.instance().clear()


def sweep_variants(overrides: list[str]) -> list[list[str]]:
    """Override lists to check a multirun with: every sweep at its first value, plus one variant per other
    value of a config-group sweep (algo=sac,nope) so that a bad choice anywhere in the sweep fails fast."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as error:
        raise _explain(error) from None
    firsts, group_alternatives = [], []
    for position, override in enumerate(parsed):
        if not override.is_sweep_override():
            firsts.append(override.input_line)
            continue
        key = override.get_key_element()
        values = list(override.sweep_string_iterator())
        firsts.append(f"{key}={values[0]}")
        if (CONF_DIR / key).is_dir():
            group_alternatives += [(position, f"{key}={value}") for value in values[1:]]
    variants = [firsts]
    for position, line in group_alternatives:
        variant = list(firsts)
        variant[position] = line
        variants.append(variant)
    return variants


def _explain(error: Exception) -> ConfigError:
    text = str(error)
    missing = re.search(r"Could not find '([\w/]+)/([^']+)'", text)
    if missing:
        group, option = missing.groups()
        options = group_options(group)
        close = difflib.get_close_matches(option, options, n=1)
        hint = f"did you mean {group}={close[0]}? " if close else ""
        return ConfigError(f"unknown {group} '{option}'", f"{hint}choose one of: {', '.join(options)}")
    not_in_struct = re.search(r"Could not override '([^']+)'", text) or re.search(r"Key '([^']+)' is not in struct", text)
    if not_in_struct:
        key = not_in_struct.group(1)
        return ConfigError(f"unknown config key '{key}'",
                           f"check the spelling (rlfarm train --cfg job lists every key), or add a new key with +{key}=...")
    if "mismatched input" in text or "no viable alternative" in text or "extraneous input" in text:
        return ConfigError(f"cannot parse override: {text.splitlines()[0]}", "write overrides as key=value, e.g. algo.lr=3e-4")
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return ConfigError(f"invalid configuration: {first}", "check the override against `rlfarm train --cfg job`")


def _positive(cfg: DictConfig, key: str, kind=float, allow_zero: bool = False) -> None:
    value = OmegaConf.select(cfg, key)
    ok_type = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int and ok_type and float(value) != int(value):
        ok_type = False
    if not ok_type:
        raise ConfigError(f"{key} must be {'an integer' if kind is int else 'a number'}, got {value!r}",
                          f"set {key}=<{'int' if kind is int else 'number'}>")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{key} must be {'>= 0' if allow_zero else '> 0'}, got {value}", f"set {key} to a {'non-negative' if allow_zero else 'positive'} value")


def validate(cfg: DictConfig) -> None:
    """Value checks Hydra cannot express. Raises ConfigError (one line) on the first problem."""
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"{missing[0]} is required but not set", f"pass {missing[0]}=<value> on the command line")
    _positive(cfg, "total_env_steps", int)
    _positive(cfg, "seed", int, allow_zero=True)
    if cfg.algo.family == "offpolicy":
        for key in ("algo.batch_size", "algo.buffer_size", "algo.chunk_steps", "algo.credits", "algo.publish_every"):
            _positive(cfg, key, int)
        _positive(cfg, "algo.learning_starts", int, allow_zero=True)
        for key in ("algo.lr", "algo.actor_lr", "algo.utd_ratio"):
            _positive(cfg, key)
        _positive(cfg, "labeler.bus_items", int)
        _positive(cfg, "labeler.bus_timeout_s", allow_zero=True)
        _positive(cfg, "env.num_envs", int)
        check_env_id(str(cfg.env.id))


def check_env_id(env_id: str) -> None:
    import gymnasium as gym

    if env_id in gym.registry:
        return
    close = difflib.get_close_matches(env_id, list(gym.registry), n=3)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise ConfigError(f"unknown env id '{env_id}'",
                      f"{hint}use env=pendulum|halfcheetah or env.id=<a registered gymnasium id>")

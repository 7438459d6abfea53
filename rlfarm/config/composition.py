"""Composing conf/ as `rlfarm <command>` would, and Hydra's and OmegaConf's exceptions turned into one line
with its fix (a ConfigError read from the exception's fields): an unknown option or key with the closest one,
a wrong type with an example, a '+' where none belongs, an override that does not parse."""
from __future__ import annotations

import difflib
import typing
from dataclasses import is_dataclass
from enum import Enum

from omegaconf import DictConfig, OmegaConf

from rlfarm.config.search import CONF_DIR, group_options, is_group, search_path, searchpath_overrides
from rlfarm.errors import ConfigError
# importing rlfarm.schemas also stores the schemas the conf/ files name in Hydra's ConfigStore
from rlfarm.schemas import FREE_FORM_KEYS


def compose(config_name: str, overrides: list[str]) -> DictConfig:
    """Compose conf/<config_name>.yaml with overrides, as `rlfarm <cmd>` would, on the same search path (conf/,
    --config-dir, hydra.searchpath: rlfarm.config.search); errors become ConfigError."""
    from hydra import compose as hydra_compose, version
    from hydra._internal.hydra import Hydra
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    version.setbase("1.3")
    try:
        check_plus_on_groups(config_name, overrides)
        Hydra.create_main_hydra2(task_name="rlfarm", config_search_path=search_path())
        return hydra_compose(config_name=config_name, overrides=[*overrides, *searchpath_overrides()],
                             return_hydra_config=False)
    except ConfigError:
        raise
    except Exception as error:  # Hydra raises several exception types; each gets translated below
        raise explain(error) from None
    finally:
        GlobalHydra.instance().clear()


def sweep_variants(overrides: list[str]) -> list[list[str]]:
    """Override lists to check a multirun with: every sweep at its first value, plus one variant per other
    value of a config-group sweep (algo=sac,nope) so that a bad choice anywhere in the sweep fails fast."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as error:
        raise explain(error) from None
    firsts, group_alternatives = [], []
    for position, override in enumerate(parsed):
        if not override.is_sweep_override():
            firsts.append(override.input_line)
            continue
        key = override.get_key_element()
        values = list(override.sweep_string_iterator())
        firsts.append(f"{key}={values[0]}")
        if is_group(key):
            group_alternatives += [(position, f"{key}={value}") for value in values[1:]]
    variants = [firsts]
    for position, line in group_alternatives:
        variant = list(firsts)
        variant[position] = line
        variants.append(variant)
    return variants


def explain(error: Exception) -> ConfigError:
    """Hydra's and OmegaConf's exception as one line with its fix, read from the exception's fields."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    cause = error.__cause__
    if isinstance(error, MissingConfigException) and error.missing_cfg_file and "/" in error.missing_cfg_file:
        group, option = error.missing_cfg_file.rsplit("/", 1)
        options = group_options(group)
        close = difflib.get_close_matches(option, options, n=1)
        hint = f"did you mean {group}={close[0]}? " if close else ""
        return ConfigError(f"unknown {group} '{option}'", f"{hint}choose one of: {', '.join(options)}")
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and cause.full_key:
        siblings = sorted(map(str, cause.parent_node.keys())) if isinstance(cause.parent_node, DictConfig) else []
        close = difflib.get_close_matches(str(cause.key), siblings, n=1)
        parent = cause.full_key.rpartition(".")[0]
        if close:
            hint = f"did you mean {parent + '.' if parent else ''}{close[0]}?"
        elif parent in FREE_FORM_KEYS or not parent:  # new keys are welcome there, with '+'
            hint = f"{'a note of your own' if not parent else 'a new key there'} needs a '+': +{cause.full_key}=..."
        else:
            hint = "check the spelling"
        return ConfigError(f"unknown config key '{cause.full_key}'", f"{hint} (`rlfarm train --cfg job` lists every key)")
    if isinstance(cause, ValidationError) and cause.full_key and is_dataclass(cause.object_type):
        expected, example = _expected(cause.object_type, str(cause.key))
        return ConfigError(f"{cause.full_key} must be {expected}, got {cause.value!r}",
                           f"set {cause.full_key}={example}")
    if isinstance(error, ConfigCompositionException) and "An item is already at" in str(error):  # a '+key' that exists
        key = str(error).split("'")[1]
        return ConfigError(f"'+{key}' adds a key, but {key} already exists", f"drop the '+': {key}=<value>")
    if isinstance(error, OverrideParseException):
        reason = "no '=' in it" if "missing EQUAL" in error.message else error.message.splitlines()[0]
        return ConfigError(f"cannot parse override '{error.override}': {reason}",
                           "write key=value, e.g. algo.lr=3e-4 (quote lists: 'model.actor.hidden=[64,64]')")
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return ConfigError(f"invalid configuration: {first}", "check the override against `rlfarm train --cfg job`")


def _expected(schema: type, key: str) -> tuple[str, str]:
    """(what a value of the schema's field `key` must be, an example of one) from the field's annotation."""
    hint = typing.get_type_hints(schema).get(key)
    kinds = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    optional = len(kinds) < len(typing.get_args(hint))
    kind = kinds[0]
    if isinstance(kind, type) and issubclass(kind, Enum):
        shown = "|".join(member.name for member in kind)
        return f"one of {shown}{'|null' if optional else ''}", shown
    named = {int: ("an integer", "<int>"), float: ("a number", "<number>"), bool: ("true or false", "true|false"),
             str: ("a string", "<text>")}
    expected, example = named.get(kind, (str(kind), "..."))
    return expected + (" or null" if optional else ""), example


def check_plus_on_groups(config_name: str, overrides: list[str]) -> None:
    """'+group=option' on a group the config already picks. Hydra refuses it too, but not when the option is the
    one already picked from an option file with its own defaults list (a schema): then the '+' passes unnoticed."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    defaults = OmegaConf.load(CONF_DIR / f"{config_name}.yaml").get("defaults") or []
    picked = {key for item in defaults if isinstance(item, DictConfig) for key in item}
    for override in OverridesParser.create().parse_overrides(overrides):
        group = override.key_or_group
        if override.is_add() and group in picked and not override.package:
            raise ConfigError(f"'+{group}=' picks a second {group}, but the config already picks one",
                              f"drop the '+': {group}=<option>")

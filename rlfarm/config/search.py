"""Where Hydra looks for config files, as `rlfarm <command>` will run it: conf/ first, then a folder of the user's
own given by Hydra's `--config-dir <folder>` (or `--config-dir=<folder>`, `-cd <folder>`), then the entries of a
`hydra.searchpath=[...]` override — the order Hydra's own app builds (hydra/_internal/utils.py: the config dir is
placed before the structured schemas, the search path entries after it). The pre-checks compose, list a group's
options ("did you mean") and read option files through this one search path, so an experiment, algo, env, reward
or topology of the user's own is found by them exactly where Hydra will find it.

`use_command_line(args)` reads it from a command line once per process (rlfarm.cli); Hydra reads the same
arguments itself when the command runs.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

from rlfarm.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parent.parent.parent / "conf"
CONFIG_DIR_FLAGS = ("--config-dir", "-cd")
REFUSED_FLAGS = ("--config-path", "-cp", "--config-name", "-cn")  # would replace rlfarm's own conf/<command>.yaml
NOT_GROUPS = ("experiment", "hydra", "schema")  # folders that are not a group of the job's config

_config_dir: str | None = None  # "file://<abs dir>" of --config-dir
_entries: tuple[str, ...] = ()  # hydra.searchpath's entries: "file://<dir>" or "pkg://<package>"
_searchpath_overrides: tuple[str, ...] = ()


def split_flags(args: list[str]) -> tuple[str | None, list[str]]:
    """(the --config-dir folder or None, the arguments without it and its value)."""
    config_dir, rest, skip = None, [], False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        name, eq, value = arg.partition("=")
        if name in REFUSED_FLAGS:
            raise ConfigError(f"{name} replaces rlfarm's own config file, which rlfarm does not support",
                              "add your own config files with --config-dir=<folder> (its experiment/, algo/, env/, "
                              "reward/, topology/ hold files like conf/'s)")
        if name in CONFIG_DIR_FLAGS:
            if not eq:
                if i + 1 >= len(args):
                    raise ConfigError(f"{name} needs a folder", f"write {name}=<folder of your config files>")
                value, skip = args[i + 1], True
            config_dir = value
            continue
        rest.append(arg)
    return config_dir, rest


def use_command_line(args: list[str]) -> None:
    """Take the search path from a command line: --config-dir and a hydra.searchpath override."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    config_dir, rest = split_flags(args)
    folder = None
    if config_dir is not None:
        folder = Path(os.path.expanduser(config_dir)).absolute()
        if not folder.is_dir():
            raise ConfigError(f"--config-dir={config_dir}: no such folder", "give the folder that holds your "
                              "experiment/, algo/, env/ ... folders")
    overrides = tuple(a for a in rest if a.lstrip("+~").startswith("hydra.searchpath="))[-1:]
    entries = []
    for override in overrides:
        try:
            entries = OverridesParser.create().parse_override(override.lstrip("+~")).value()
        except Exception:
            entries = None
        if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
            raise ConfigError(f"{override}: not a list of folders",
                              "write 'hydra.searchpath=[file://<folder>]' (quoted for the shell)")
        for entry in entries:
            if entry.startswith("file://") and not Path(os.path.expanduser(entry[7:])).is_dir():
                raise ConfigError(f"hydra.searchpath: no such folder '{entry[7:]}'",
                                  "give folders that exist: 'hydra.searchpath=[file://<folder>]'")
    use(f"file://{folder}" if folder else None, tuple(entries), overrides)


def use(config_dir: str | None, entries: tuple[str, ...] = (), searchpath_overrides: tuple[str, ...] = ()) -> None:
    """Set the search path: the --config-dir entry ("file://<abs dir>"), the hydra.searchpath entries and the
    override that names them (composing passes it to Hydra, which adds the entries itself)."""
    global _config_dir, _entries, _searchpath_overrides
    _config_dir, _entries, _searchpath_overrides = config_dir, tuple(entries), tuple(searchpath_overrides)
    repository.cache_clear()


def searchpath_overrides() -> list[str]:
    return list(_searchpath_overrides)


def search_path(with_entries: bool = False):
    """Hydra's ConfigSearchPath as its app builds it: conf/, then --config-dir before the schemas. The
    hydra.searchpath entries come after (`with_entries`), where Hydra puts them while it composes."""
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery

    path = create_config_search_path(str(CONF_DIR))
    for entry, provider in ([(_config_dir, "command-line")] if _config_dir else []) + \
            ([(e, "hydra.searchpath in command-line") for e in _entries] if with_entries else []):
        path.prepend(provider=provider, path=entry, anchor=SearchPathQuery(provider="schema"))
    return path


@functools.lru_cache(maxsize=1)
def repository():
    """Every config source of the search path, as Hydra reads them."""
    from hydra._internal.config_repository import ConfigRepository

    return ConfigRepository(config_search_path=search_path(with_entries=True))


def group_options(group: str) -> list[str]:
    """The options of a config group over the whole search path (conf/'s and the user's own)."""
    from hydra.core.object_type import ObjectType

    return sorted(repository().get_group_options(group, ObjectType.CONFIG))


def is_group(name: str) -> bool:
    return repository().group_exists(name)


def group_names() -> frozenset[str]:
    """The config groups of the job's config (not experiment/: it sets keys of several groups)."""
    from hydra.core.object_type import ObjectType

    return frozenset(g for g in repository().get_group_options("", ObjectType.GROUP) if g not in NOT_GROUPS)


def option_configs(group: str):
    """(option, its file's config, whether it is `# @package _global_`) for every option of `group`."""
    for option in group_options(group):
        loaded = repository().load_config(f"{group}/{option}")
        if loaded is not None:
            yield option, loaded.config, loaded.header.get("package") == "_global_"

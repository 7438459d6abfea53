"""Composing conf/ before a run starts, and what Hydra cannot check, each problem as one clear line.

The config is plain Hydra: conf/ holds one directory per choice, and the schemas in rlfarm/schemas.py type its
keys, so Hydra refuses a wrong type, choice or key while it composes (`compose` turns its exceptions into a
ConfigError from their fields) and each schema's `__post_init__` checks ranges (`check_schema_ranges`). `validate`
adds what no single config group can say: the rules across groups (an algo family and its env, reward, model
and topology) and the paths a config names (files and model folders, declared in rlfarm.schemas.PATH_SETTINGS;
`_target_`s). `check_known_keys` refuses what Hydra lets through: a key added with `+` that nothing reads.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import inspect
import json
import os
import tempfile
import typing
from dataclasses import is_dataclass
from enum import Enum
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlfarm.errors import ConfigError
# importing rlfarm.schemas also stores the schemas the conf/ files name in Hydra's ConfigStore
from rlfarm.schemas import FREE_FORM_KEYS, PATH_SETTINGS, PATH_SETTINGS_BY_TARGET, PathKind
from rlfarm.settings import RangeError

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def compose(config_name: str, overrides: list[str]) -> DictConfig:
    """Compose conf/<config_name>.yaml with overrides, as `rlfarm <cmd>` would; errors become ConfigError."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        check_plus_on_groups(config_name, overrides)
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return hydra_compose(config_name=config_name, overrides=overrides, return_hydra_config=False)
    except ConfigError:
        raise
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
    """What the schemas cannot say: the rules across config groups and the paths a config names. Raises
    ConfigError (one line) on the first problem; imports the `_target_` modules last (they pull torch)."""
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"{missing[0]} is required but not set", f"pass {missing[0]}=<value> on the command line")
    check_schema_ranges(cfg)
    check_paths(cfg)
    if cfg.algo.family == "offpolicy":
        check_env_id(str(cfg.env.id), cfg.env.get("kwargs"))
        check_learner_ranks(cfg)
    if "batch_chunks" in cfg.algo:
        check_actor_learner(cfg)
    if cfg.algo.family == "onpolicy_env":
        check_ppo(cfg)
    if cfg.algo.family == "onpolicy":
        check_text_policy(cfg)
    if cfg.algo.family == "vla":
        check_vla_policy(cfg)
    check_targets(cfg)
    check_fitted_reward(cfg)


MODULE_REWARD = "rlfarm.rewards.model.ModuleReward"


def check_fitted_reward(cfg: DictConfig) -> None:
    """reward=model reward.model=<file>: the file is one rlfarm fit-reward wrote (read now, not in a labeler)."""
    model = OmegaConf.select(cfg, "reward.model", default=None)
    if OmegaConf.select(cfg, "reward._target_", default=None) != MODULE_REWARD or model is None:
        return
    from rlfarm.rewards.base import RewardModelError
    from rlfarm.rewards.fitted import read_fitted

    try:
        read_fitted(os.path.expanduser(str(model)))
    except RewardModelError as error:
        problem, _, fix = str(error).rpartition("; ")
        raise ConfigError(f"reward.model: {problem}", fix) from None


ENV_REWARD = "rlfarm.rewards.env.EnvReward"


def check_learner_ranks(cfg: DictConfig) -> None:
    """Several learner ranks off-policy: only an actor-learner has them (SAC's replay learner is one process), and
    each rank needs runners of its own (runner i feeds rank i mod N)."""
    ranks = int(OmegaConf.select(cfg, "topology.roles.learner.count", default=1))
    if ranks <= 1:
        return
    if "batch_chunks" not in cfg.algo:
        raise ConfigError(f"algo={cfg.algo.name} has one learner, but topology.roles.learner.count={ranks}",
                          "set topology.roles.learner.count=1 (data-parallel learner ranks: algo=impala|appo)")
    runners = int(OmegaConf.select(cfg, "topology.roles.env_runner.count", default=1))
    if runners < ranks:
        raise ConfigError(f"{ranks} learner ranks need at least as many env runners (runner i feeds rank i mod "
                          f"{ranks}), got topology.roles.env_runner.count={runners}",
                          f"set topology.roles.env_runner.count>={ranks}")


def check_actor_learner(cfg: DictConfig) -> None:
    """IMPALA / APPO: one actor-critic network, and batches the runners' credits can fill (a chunk's credit returns
    only once a batch took it: fewer chunks in flight than a batch would wait forever)."""
    if OmegaConf.select(cfg, "model.actor._target_", default=None) is None or "critic" in cfg.model:
        raise ConfigError(f"algo={cfg.algo.name} needs one actor-critic network in model.actor, not "
                          f"{'a language model' if 'actor' not in cfg.model else 'an actor with separate critics'}",
                          "use model=actor_critic (or model=cnn_actor_critic for image observations)")
    if cfg.algo.loss == "impala" and int(cfg.algo.get("target_update_every", 0)):
        raise ConfigError("algo.target_update_every anchors APPO's clip to a target network; IMPALA's loss has no clip",
                          "use algo=appo, or set algo.target_update_every=0")
    runners = int(OmegaConf.select(cfg, "topology.roles.env_runner.count", default=1))
    ranks = int(OmegaConf.select(cfg, "topology.roles.learner.count", default=1))
    per_rank = runners // ranks  # the fewest runners a rank has (runner i feeds rank i mod N)
    in_flight = per_rank * int(cfg.algo.credits)
    if int(cfg.algo.batch_chunks) > in_flight:
        who = f"{runners} env runners" if ranks == 1 else f"{per_rank} env runners per learner rank"
        raise ConfigError(f"algo.batch_chunks={cfg.algo.batch_chunks} is more than the {in_flight} chunks the runners "
                          f"can have in flight ({who} × algo.credits={cfg.algo.credits})",
                          f"set algo.batch_chunks <= {in_flight}, or raise algo.credits")


def check_ppo(cfg: DictConfig) -> None:
    """PPO on gymnasium envs: a registered env, minibatches its rollouts can fill, and the two choices it cannot
    take from another family (a reward model, separate critics)."""
    if OmegaConf.select(cfg, "env.task", default=None) is not None:
        raise ConfigError(f"algo={cfg.algo.name} runs on gymnasium envs, but env.id={cfg.env.id} is a text task",
                          "pick env=cartpole|pendulum|halfcheetah, or algo=grpo for text tasks")
    check_env_id(str(cfg.env.id), cfg.env.get("kwargs"))
    batch = int(cfg.algo.rollout_steps) * int(cfg.env.num_envs)
    if int(cfg.algo.minibatches) > batch:
        raise ConfigError(f"algo.minibatches={cfg.algo.minibatches} is more than the {batch} transitions a runner "
                          f"collects per cycle (algo.rollout_steps × env.num_envs)", f"set algo.minibatches <= {batch}")
    reward = OmegaConf.select(cfg, "reward._target_", default=None)
    if reward != ENV_REWARD:
        raise ConfigError(f"algo={cfg.algo.name} learns from the env's own reward, not "
                          f"{reward or 'a text verifier'}", "use reward=env (or pick algo=sac for a reward model)")
    if OmegaConf.select(cfg, "model.actor._target_", default=None) is None or "critic" in cfg.model:
        raise ConfigError(f"algo={cfg.algo.name} needs one actor-critic network in model.actor, "
                          f"not {'a language model' if 'actor' not in cfg.model else 'an actor with separate critics'}",
                          "use model=actor_critic")


def check_vla_policy(cfg: DictConfig) -> None:
    """A VLA is the tiny built-in one (model.config) or an HF checkpoint folder (model=hf_vla model.source)."""
    if OmegaConf.select(cfg, "model.config", default=None) is None:
        raise ConfigError(f"algo={cfg.algo.name} needs a VLA policy, but this model has no model.config",
                          "use model=tiny_vla, or model=hf_vla model.source=<folder>")
    source = cfg.model.get("source")
    if source is not None and not os.path.isdir(os.path.expanduser(str(source))):
        raise ConfigError(f"model.source: no such folder '{source}' (VLA checkpoints load from a local folder)",
                          "set model.source=<a folder written by save_pretrained: model, tokenizer>")


def check_text_policy(cfg: DictConfig) -> None:
    """GRPO on text: a text task, a verifier to score it, one language model (built or loaded), and for a
    prompt file a tokenizer and a readable file with the named fields — all before Ray starts."""
    task = OmegaConf.select(cfg, "env.task", default=None)
    if task is None:
        raise ConfigError(f"algo={cfg.algo.name} generates text, but env={cfg.env.id} is not a text task",
                          "pick env=digits|prompts, or algo=ppo|sac for gymnasium envs")
    verifier = OmegaConf.select(cfg, "reward.verifier", default=None)
    if verifier is None:
        raise ConfigError(f"algo={cfg.algo.name} scores completions with a rule verifier, but this reward has none",
                          "use reward=verifier (reward.verifier=exact_match|last_number|partial_credit)")
    from rlfarm.rewards.verifiers import VERIFIERS  # numpy only: no torch import before the run starts
    if verifier not in VERIFIERS:
        raise ConfigError(f"unknown reward.verifier {verifier!r}", f"set reward.verifier={'|'.join(VERIFIERS)}")
    source, config = cfg.model.get("source"), cfg.model.get("config")
    if (source is None) == (config is None):
        raise ConfigError(f"algo={cfg.algo.name} needs one language model: model.config (build) or model.source "
                          f"(load), {'not both' if source is not None else 'found neither'}",
                          "use model=tiny_lm, or model=hf_lm model.source=<hub id or folder>")
    learner = cfg.topology.roles.learner
    if cfg.algo.advantage == "gae" and (int(learner.get("count", 1)) > 1 or float(learner.get("gpus", 0)) > 1):
        raise ConfigError(f"algo.advantage=gae trains its critic on one learner rank, but topology={cfg.topology.name} "
                          "gives the learner several GPUs", "use topology=colocated, split_1_1 or local_llm")
    if cfg.algo.weight_sync == "ipc":
        roles = cfg.topology.roles
        if roles.learner.pool is None or roles.learner.pool != roles.engine.pool or not roles.engine.gpus:
            raise ConfigError(f"algo.weight_sync=ipc needs the learner and the engine on one GPU, but topology="
                              f"{cfg.topology.name} puts them apart", "use topology=colocated, or algo.weight_sync=auto")
    if task == "prompts":
        if source is None:
            raise ConfigError("prompt files need a tokenizer, but model.config builds a model without one",
                              "use model=hf_lm model.source=<path>")
        if cfg.env.get("chat_template") and _looks_local(str(source)) and not has_chat_template(str(source)):
            raise ConfigError(f"env.chat_template=true, but the tokenizer in '{source}' has no chat template",
                              "set env.chat_template=false (questions as plain text), or save a tokenizer with one")
        check_prompt_file(cfg.env)


def has_chat_template(folder: str) -> bool:
    """Whether a saved tokenizer has a chat template, read from its files (no transformers import): a
    `chat_template.jinja`/`.json` beside it (transformers ≥ 4.43 writes these) or the key in tokenizer_config.json."""
    folder = os.path.expanduser(folder)
    if any(os.path.exists(os.path.join(folder, name)) for name in ("chat_template.jinja", "chat_template.json")):
        return True
    try:
        with open(os.path.join(folder, "tokenizer_config.json")) as file:
            return bool(json.load(file).get("chat_template"))
    except (OSError, ValueError):
        return True  # no readable config: leave it to the tokenizer's own loading, which says what is wrong


def check_prompt_file(env: DictConfig) -> None:
    """The prompt file exists, has a known type, and every record holds the question and answer fields."""
    from rlfarm.envs.text_tasks import PromptDataset  # numpy + json only

    path = os.path.expanduser(str(env.path))
    try:
        PromptDataset.from_file(path, str(env.question_field), str(env.answer_field))
    except FileNotFoundError:
        raise ConfigError(f"env.path: no such file '{env.path}'",
                          "set env.path=<a .jsonl or .parquet file of question/answer records>") from None
    except KeyError as error:
        field = env.question_field if f"'{env.question_field}'" in str(error) else env.answer_field
        key = "env.question_field" if field == env.question_field else "env.answer_field"
        raise ConfigError(str(error.args[0]), f"set {key}=<the field that holds it>") from None
    except (ValueError, ImportError) as error:  # unsupported suffix, bad JSON, no records, no pyarrow
        raise ConfigError(f"env.path={env.path}: {str(error).splitlines()[0]}",
                          "give a .jsonl (one JSON record a line) or .parquet file of question/answer records") from None


def check_env_id(env_id: str, kwargs: DictConfig | None = None) -> None:
    """A registered gymnasium id, or "module:Id" whose module registers it (imported here, as gymnasium would)."""
    import gymnasium as gym

    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ConfigError(f"env.id={env_id}: cannot import {module} ({error})",
                              "fix the module part of env.id (module:Id)") from None
    if name in gym.registry:
        if name == "RlfarmAtari-v0":
            from rlfarm.envs.atari import check_game

            check_game(str((kwargs or {}).get("game", "Pong")))
        return
    close = difflib.get_close_matches(env_id, list(gym.registry), n=3)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise ConfigError(f"unknown env id '{env_id}'",
                      f"{hint}use env=pendulum|halfcheetah or env.id=<a registered gymnasium id>")


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
                    if path == group and (CONF_DIR / group).is_dir() else "")
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


# ---- keys nothing reads: Hydra's `+key=value` adds a key even to a schema node, where a typo would be ignored

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


@functools.lru_cache(maxsize=None)
def group_names() -> frozenset[str]:
    return frozenset(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name not in ("experiment", "hydra"))


@functools.lru_cache(maxsize=None)
def _group_keys() -> dict[str, set[str]]:
    """dotted path → the keys some option of a config group (or an experiment) sets there, e.g. "topology.roles"
    → {learner, env_runner, labeler, engine}: the settings of groups that have no schema."""
    keys: dict[str, set[str]] = {}

    def collect(node, path: str) -> None:
        if isinstance(node, dict):
            keys.setdefault(path, set()).update(str(key) for key in node if key != "defaults")
            for key, value in node.items():
                collect(value, f"{path}.{key}")

    for folder in (*group_names(), "experiment"):
        for option in (CONF_DIR / folder).glob("*.yaml"):
            tree = OmegaConf.to_container(OmegaConf.load(option), resolve=False)
            if option.read_text().startswith("# @package _global_"):  # sets keys of several groups
                for group in group_names() & set(tree):
                    collect(tree[group], group)
            else:
                collect(tree, folder)
    return keys


# ---- paths the user names: checked here rather than where a labeler or Hydra first opens them


def _looks_local(value: str) -> bool:
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
    return f"no such folder '{value}'" if _looks_local(value) or value.count("/") > 1 else None  # hub id: org/name


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

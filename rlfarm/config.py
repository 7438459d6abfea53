"""Config composition checks that turn Hydra/OmegaConf failures and bad values into one clear line.

The config itself is plain Hydra: conf/ holds one directory per choice. `preflight` composes it once
with Hydra's compose API (before any run directory exists) so that an unknown option, an unknown key or
a bad value fails fast; `validate` checks values that Hydra cannot type-check.
"""
from __future__ import annotations

import ast
import difflib
import functools
import json
import os
import re
import sys
import tempfile
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
    chosen = (re.search(r"Multiple values for ([\w/.]+)\.", text)
              or re.search(r"([\w/.]+) appears more than once in the final defaults list", text))
    if chosen:
        group = chosen.group(1)
        return ConfigError(f"'+{group}=' picks a second {group}, but the config already picks one",
                           f"drop the '+': {group}=<option>")
    exists = re.search(r"An item is already at '([^']+)'", text)
    if exists:
        key = exists.group(1)
        return ConfigError(f"'+{key}' adds a key, but {key} already exists", f"drop the '+': {key}=<value>")
    override = getattr(error, "override", None)  # hydra.errors.OverrideParseException names the bad override
    parse_errors = ("mismatched input", "no viable alternative", "extraneous input")
    if override is not None or any(m in text for m in parse_errors):
        what = f" '{override}'" if override else ""
        reason = text.splitlines()[0].replace("LexerNoViableAltException: ", "bad character in ")
        reason = "no '=' in it" if "missing EQUAL" in text else reason
        return ConfigError(f"cannot parse override{what}: {reason}",
                           "write key=value, e.g. algo.lr=3e-4 (quote lists: 'model.actor.hidden=[64,64]')")
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
    _check_run_and_ray(cfg)
    check_targets(cfg)
    check_local_paths(cfg)
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
    if cfg.algo.family == "onpolicy_env":
        check_ppo(cfg)
    if cfg.algo.family == "onpolicy":
        check_text_policy(cfg)
    if cfg.algo.family == "vla":
        check_vla_policy(cfg)


ENV_REWARD = "rlfarm.rewards.env.EnvReward"


def check_ppo(cfg: DictConfig) -> None:
    """PPO on gymnasium envs: the env, its own keys, and the two choices it cannot take from another family."""
    if OmegaConf.select(cfg, "env.task", default=None) is not None:
        raise ConfigError(f"algo={cfg.algo.name} runs on gymnasium envs, but env.id={cfg.env.id} is a text task",
                          "pick env=cartpole|pendulum|halfcheetah, or algo=grpo for text tasks")
    check_env_id(str(cfg.env.id))
    for key in ("algo.rollout_steps", "algo.epochs", "algo.minibatches", "env.num_envs"):
        _positive(cfg, key, int)
    for key in ("algo.lr", "algo.clip_eps", "algo.max_grad_norm"):
        _positive(cfg, key)
    for key in ("algo.vf_coef", "algo.ent_coef"):
        _positive(cfg, key, allow_zero=True)
    for key in ("algo.value_clip_eps", "algo.target_kl"):
        _optional_positive(cfg, key)
    for key in ("algo.gamma", "algo.gae_lambda"):
        _positive(cfg, key, allow_zero=True)
        if OmegaConf.select(cfg, key) > 1:
            raise ConfigError(f"{key} must be in [0, 1], got {OmegaConf.select(cfg, key)}", f"set {key} to e.g. 0.99")
    _choice(cfg, "algo.anneal_lr", (True, False))
    _choice(cfg, "algo.norm_adv", (True, False))
    target = OmegaConf.select(cfg, "algo.target_return", default=None)
    if target is not None and (isinstance(target, bool) or not isinstance(target, (int, float))):
        raise ConfigError(f"algo.target_return must be a number or null, got {target!r}", "e.g. algo.target_return=400")
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


# learner → engine: auto picks ipc (one GPU), broadcast (separate GPUs) or object_store (CPU); `rlfarm.sync`
WEIGHT_SYNCS = ("auto", "object_store", "broadcast", "ipc")
DATA_PARALLEL = ("ddp", "fsdp")  # rlfarm.distributed.DATA_PARALLEL (not imported: no torch before the run starts)


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
    if source is not None and _looks_local(str(source)) and not os.path.isdir(os.path.expanduser(str(source))):
        raise ConfigError(f"model.source: no such folder '{source}'",
                          "set model.source=<a folder written by save_pretrained> or a hub id like Qwen/Qwen2.5-0.5B")
    _choice(cfg, "algo.weight_sync", WEIGHT_SYNCS)
    _choice(cfg, "algo.data_parallel", DATA_PARALLEL)
    _choice(cfg, "algo.advantage", ("grpo", "gae"))
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


def check_env_id(env_id: str) -> None:
    import gymnasium as gym

    if env_id in gym.registry:
        return
    close = difflib.get_close_matches(env_id, list(gym.registry), n=3)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise ConfigError(f"unknown env id '{env_id}'",
                      f"{hint}use env=pendulum|halfcheetah or env.id=<a registered gymnasium id>")


def _optional_positive(cfg: DictConfig, key: str, kind=float, allow_zero: bool = False) -> None:
    if OmegaConf.select(cfg, key, default=None) is not None:
        _positive(cfg, key, kind, allow_zero)


def _choice(cfg: DictConfig, key: str, allowed: tuple) -> None:
    value = OmegaConf.select(cfg, key, default=None)
    if not any(value is a if isinstance(a, bool) else value == a for a in allowed):
        shown = "|".join(str(a).lower() if isinstance(a, bool) else str(a) for a in allowed)
        raise ConfigError(f"{key} must be one of {shown}, got {value!r}", f"set {key}={shown}")


def _check_run_and_ray(cfg: DictConfig) -> None:
    """Keys that otherwise fail deep inside a run (or are silently ignored) after minutes of work."""
    if OmegaConf.select(cfg, "run", default=None) is not None:
        _choice(cfg, "run.live", ("auto", True, False))
        _choice(cfg, "run.checkpoint", (True, False))
        _positive(cfg, "run.metrics_interval_s")
        _optional_positive(cfg, "run.max_wall_s")
        _optional_positive(cfg, "run.max_restarts", int, allow_zero=True)
        _optional_positive(cfg, "run.restart_timeout_s")
    if OmegaConf.select(cfg, "ray", default=None) is not None:
        _choice(cfg, "ray.dashboard", (True, False))
        _optional_positive(cfg, "ray.num_cpus")
        _optional_positive(cfg, "ray.num_gpus", int, allow_zero=True)
        _positive(cfg, "ray.ready_timeout_s")


# ---- _target_ nodes: checked without importing them (importing rlfarm.rewards alone pulls torch: seconds)


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
    """Why `target` (a dotted module.attr path) cannot be located, or None when it can (or cannot be told
    without importing it). Mirrors hydra.utils' _locate: the longest importable module prefix, then attributes.
    Modules are found, not run: their source is parsed for top-level names."""
    import importlib.util
    from importlib.machinery import PathFinder

    parts = target.split(".")
    if not all(part.isidentifier() for part in parts):
        return "is not a dotted Python path like package.module.Class"
    spec, depth = None, 0
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        module = sys.modules.get(name)
        if module is not None:
            found = getattr(module, "__spec__", None)
        elif spec is None:
            try:
                found = importlib.util.find_spec(name)  # a top-level name: finding it runs nothing
            except (ImportError, ValueError):
                found = None
        elif spec.submodule_search_locations:
            found = PathFinder.find_spec(name, list(spec.submodule_search_locations))
        else:
            found = None
        if found is None:
            if spec is None:
                return f"cannot be imported: no module named '{name}'"
            depth -= 1
            break
        spec = found
    module_name = ".".join(parts[:depth])
    if depth == len(parts):
        return None
    attr = parts[depth]
    module = sys.modules.get(module_name)
    if module is not None:
        names = set(dir(module))
    else:
        names = _top_level_names(spec.origin)
        if names is None:
            return None  # compiled module, star import or module __getattr__: only importing would tell
    if attr in names:
        return None
    close = difflib.get_close_matches(attr, sorted(n for n in names if not n.startswith("_")), n=1)
    hint = f" (did you mean {module_name}.{close[0]}?)" if close else ""
    return f"cannot be imported: module '{module_name}' has no '{attr}'{hint}"


@functools.lru_cache(maxsize=None)
def _top_level_names(origin: str | None) -> frozenset[str] | None:
    if not origin or not origin.endswith(".py"):
        return None
    try:
        source = Path(origin).read_text(encoding="utf-8")
        tree = ast.parse(source, filename=origin)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    if "globals()" in source:  # names made at import time: only importing would tell
        return None
    names: set[str] = set()
    pending = list(tree.body)
    while pending:
        stmt = pending.pop()
        if isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if stmt.name == "__getattr__":
                return None
            names.add(stmt.name)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            for alias in stmt.names:
                if alias.name == "*":
                    return None
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(stmt, (ast.If, ast.Try, ast.With)):  # conditional definitions count
            pending += [*stmt.body, *getattr(stmt, "orelse", []), *getattr(stmt, "finalbody", []),
                        *(s for h in getattr(stmt, "handlers", []) for s in h.body)]
    return None if "__getattr__" in names else frozenset(names)  # e.g. lazy_loader.attach(...)


# ---- paths the user names: checked here rather than where a labeler or Hydra first opens them


def _looks_local(value: str) -> bool:
    return os.path.isabs(value) or value.startswith((".", "~"))


def check_local_paths(cfg: DictConfig) -> None:
    """A reward model given as a local path must exist: the labeler would only find out after Ray started."""
    model = OmegaConf.select(cfg, "reward.model", default=None)
    if isinstance(model, str) and _looks_local(model) and not os.path.exists(os.path.expanduser(model)):
        raise ConfigError(f"reward.model: no such file or folder '{model}'",
                          "set reward.model=<an existing local folder (save_pretrained)> or a hub id like org/name")
    checkpoint = OmegaConf.select(cfg, "reward.checkpoint", default=None)
    if isinstance(checkpoint, str) and not os.path.isfile(os.path.expanduser(checkpoint)):
        raise ConfigError(f"reward.checkpoint: no such file '{checkpoint}'",
                          "set reward.checkpoint=<an existing file> or reward.checkpoint=null")


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

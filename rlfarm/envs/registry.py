"""Env ids → gymnasium registry entries, for envs of rlfarm's and of the user's own. Two hooks make an env of one's
own known to every process that builds it (the driver, Ray's workers, env worker processes, `rlfarm eval`):

- `env.id=<module>:<Id>`: the module that registers Id is imported first (gymnasium's own "module:Id" form);
- `env.imports=[<module>, ...]`: modules imported before any id is looked up, for a plain `env.id=<Id>` they
  register. `use_env_modules` imports them and names them in RLFARM_ENV_IMPORTS, which child processes inherit
  (rlfarm.cluster hands it to the Ray workers) and `registered_spec` reads.

An unknown id is one line naming the closest ids and both hooks. `is_mujoco` tells whether an id is a MuJoCo env
without importing MuJoCo for envs that are not."""
from __future__ import annotations

import difflib
import importlib
import os

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

IMPORTS_VAR = "RLFARM_ENV_IMPORTS"  # comma-separated modules every process imports before it looks up an env id
HOW_TO_ADD = ("an env of your own: env.id=<module>:<Id> (the module calls gymnasium.register(id=<Id>, ...)), "
              "or env.imports=[<module>] env.id=<Id>")


class UnknownEnvError(ValueError):
    """An env id that gymnasium's registry does not know, or whose module cannot be imported: the problem and its
    fix (one line; rlfarm.config turns them into a ConfigError)."""

    def __init__(self, problem: str, fix: str):
        super().__init__(f"{problem}; {fix}")
        self.problem, self.fix = problem, fix


def use_env_modules(modules) -> None:
    """Import `modules` (env.imports) here and in every process started from here on."""
    modules = [str(m) for m in modules or ()]
    if modules:
        os.environ[IMPORTS_VAR] = ",".join(dict.fromkeys([*_named_imports(), *modules]))
    _import_named()


def _named_imports() -> list[str]:
    return [m for m in os.environ.get(IMPORTS_VAR, "").split(",") if m]


def _import_named() -> None:
    for module in _named_imports():
        _import(module, f"env.imports={module}")


def _import(module: str, setting: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError as error:
        fix = ("run rlfarm from the folder that holds it, or put that folder on PYTHONPATH"
               if error.name == module.split(".")[0] else f"fix the import inside {module}")
        raise UnknownEnvError(f"{setting}: cannot import {module} ({error})", fix) from None


def registered_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    """The registry entry for env_id ("Id", or "module:Id" to import the registering module first), after the
    modules of env.imports, or UnknownEnvError naming the closest registered ids."""
    _import_named()
    module, _, name = env_id.rpartition(":")
    if module:
        _import(module, f"env.id={env_id}")
    if name in gym.registry:
        return gym.registry[name]
    closest = difflib.get_close_matches(name, list(gym.registry), n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(closest)}? " if closest else ""
    if module:
        raise UnknownEnvError(f"env.id={env_id}: {module} registers no env '{name}'",
                              f"{hint}register it there: gymnasium.register(id='{name}', entry_point=...)")
    raise UnknownEnvError(f"unknown env id '{env_id}'", f"{hint}use env=pendulum|halfcheetah or env.id=<gymnasium "
                          f"id>; for {HOW_TO_ADD}")


def is_mujoco(env_id: str) -> bool:
    """Whether env_id is a MuJoCo env (what batch_render applies to), without importing MuJoCo otherwise."""
    return is_mujoco_spec(registered_spec(env_id))


def is_mujoco_spec(spec: gym.envs.registration.EnvSpec) -> bool:
    creator = spec.entry_point
    if isinstance(creator, str) and "mujoco" not in creator.lower():
        return False  # importing MuJoCo loads its GL backend (EGL): not for envs that do not need it
    if not isinstance(creator, (str, type)):
        return False  # a factory function: not one of gymnasium's MuJoCo env classes
    from gymnasium.envs.mujoco.mujoco_env import MujocoEnv

    if isinstance(creator, str):
        creator = load_env_creator(creator)
    return isinstance(creator, type) and issubclass(creator, MujocoEnv)

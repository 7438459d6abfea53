"""Env ids → gymnasium registry entries: the `module:Id` hook (import the module that registers the id first), a
one-line error naming the closest ids for an unknown one, and whether an id is a MuJoCo env (without importing
MuJoCo for envs that are not)."""
from __future__ import annotations

import difflib
import importlib

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator


class UnknownEnvError(ValueError):
    """An env id that gymnasium's registry does not know."""


def registered_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    """The registry entry for env_id ("Id", or "module:Id" to import the registering module first), or
    UnknownEnvError naming the closest registered ids."""
    module, _, name = env_id.rpartition(":")
    if module:
        importlib.import_module(module)
    if name in gym.registry:
        return gym.registry[name]
    closest = difflib.get_close_matches(name, list(gym.registry), n=3, cutoff=0.5)
    hint = f" (closest: {', '.join(closest)})" if closest else ""
    raise UnknownEnvError(
        f"unknown env id {env_id!r}{hint}; use env=pendulum|halfcheetah or env.id=<gymnasium id>"
    )


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

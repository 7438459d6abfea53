"""The tasks a VLA rollout worker can play, by `env.id`: each builds an env with the SapienPushCube interface
(image, proprio, instruction; [-1, 1] actions; binary success) and names its instruction vocabulary.

  SapienPushCube                      physics-only SAPIEN push-cube (rlfarm/envs/sapien_tasks.py): no Vulkan
  PushCube-v1, PickCube-v1, ...       ManiSkill3 tasks through a camera (rlfarm/envs/maniskill_tasks.py): Vulkan

Simulators are imported only when an env is built: rlfarm installs and runs without them.
"""
from __future__ import annotations

import gymnasium as gym

from rlfarm.envs import maniskill_tasks  # its task table and vocabulary need no mani_skill
from rlfarm.errors import ConfigError


def check_vla_task(env_id: str) -> None:
    """ConfigError (one line) for an id no VLA task answers to."""
    if env_id != "SapienPushCube" and env_id not in maniskill_tasks.TASKS:
        raise ConfigError(f"unknown VLA task '{env_id}'",
                          f"use env=sapien_push_cube|maniskill_push_cube|maniskill_pick_cube or env.id= one of "
                          f"SapienPushCube, {', '.join(maniskill_tasks.TASKS)}")


def make_vla_task(env_id: str, **kwargs) -> gym.Env:
    check_vla_task(env_id)
    if env_id == "SapienPushCube":
        from rlfarm.envs.sapien_tasks import SapienPushCube  # imports sapien

        return SapienPushCube(**kwargs)
    return maniskill_tasks.ManiSkillTask(env_id, **kwargs)


def instruction_vocabulary(env_id: str) -> list[str]:
    """The words the task's instructions use: the tiny VLA's language vocabulary."""
    check_vla_task(env_id)
    if env_id == "SapienPushCube":
        from rlfarm.envs.sapien_tasks import instruction_vocabulary as words  # imports sapien

        return words()
    return maniskill_tasks.instruction_vocabulary((env_id,))

"""The tasks a VLA rollout worker can play, by `env.id`: each builds an env with the SapienPushCube interface
(image, proprio, instruction; [-1, 1] actions; binary success) and names its instruction vocabulary.

  SapienPushCube                      physics-only SAPIEN push-cube (rlfarm/envs/sapien_tasks.py): no Vulkan
  PushCube-v1, PickCube-v1, ...       ManiSkill3 tasks through a camera (rlfarm/envs/maniskill_tasks.py): Vulkan

Simulators are imported only when their task is asked for: rlfarm installs and runs without them.
"""
from __future__ import annotations

import gymnasium as gym

from rlfarm.errors import ConfigError

MANISKILL_TASKS = ("PushCube-v1", "PickCube-v1", "PullCube-v1", "StackCube-v1")  # maniskill_tasks.TASKS' keys


def check_vla_task(env_id: str) -> None:
    """ConfigError (one line) for an id no VLA task answers to."""
    if env_id != "SapienPushCube" and env_id not in MANISKILL_TASKS:
        raise ConfigError(f"unknown VLA task '{env_id}'",
                          f"use env=sapien_push_cube|maniskill_push_cube|maniskill_pick_cube or env.id= one of "
                          f"SapienPushCube, {', '.join(MANISKILL_TASKS)}")


def make_vla_task(env_id: str, **kwargs) -> gym.Env:
    check_vla_task(env_id)
    if env_id == "SapienPushCube":
        from rlfarm.envs.sapien_tasks import SapienPushCube

        return SapienPushCube(**kwargs)
    from rlfarm.envs.maniskill_tasks import ManiSkillTask

    return ManiSkillTask(env_id, **kwargs)


def instruction_vocabulary(env_id: str) -> list[str]:
    """The words the task's instructions use: the tiny VLA's language vocabulary."""
    check_vla_task(env_id)
    if env_id == "SapienPushCube":
        from rlfarm.envs.sapien_tasks import instruction_vocabulary as words

        return words()
    from rlfarm.envs.maniskill_tasks import instruction_vocabulary as words

    return words((env_id,))

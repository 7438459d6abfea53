"""Environments: gymnasium vector envs that yield replay-safe transitions and optional frames."""

from rlfarm.envs.registry import UnknownEnvError
from rlfarm.envs.vector import StepResult, VectorEnv

__all__ = ["StepResult", "UnknownEnvError", "VectorEnv"]

"""Environments: gymnasium vector envs that yield replay-safe transitions and optional frames."""

from rlfarm.envs.vector import StepResult, UnknownEnvError, VectorEnv

__all__ = ["StepResult", "UnknownEnvError", "VectorEnv"]

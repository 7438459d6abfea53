"""Reward models the labelers run on batches of raw transitions: env (ground truth), CLIP, any torch module."""

from rlfarm.rewards.base import RewardModel, RewardModelError
from rlfarm.rewards.clip import ClipReward, goal_baseline_reward
from rlfarm.rewards.env import EnvReward
from rlfarm.rewards.model import BrightnessReward, ModuleReward

__all__ = [
    "BrightnessReward",
    "ClipReward",
    "EnvReward",
    "ModuleReward",
    "RewardModel",
    "RewardModelError",
    "goal_baseline_reward",
]

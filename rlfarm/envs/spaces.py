"""What a policy network must know of an env's spaces, for both action kinds.

`policy_dims` is the one place that maps gymnasium spaces to network constructor arguments
(obs_dim, act_dim, action_low, action_high): a Box gives its flat size and bounds, a Discrete its number of
actions and no bounds (None marks a discrete policy head; see rlfarm.models.actor_critic).
"""
from __future__ import annotations

import numpy as np
from gymnasium import spaces

from rlfarm.envs.rendering import make_env


def policy_dims(observation_space: spaces.Space, action_space: spaces.Space) -> dict:
    """{"obs_dim", "act_dim", "action_low", "action_high"} for a Box or Discrete action space."""
    obs_dim = int(np.prod(observation_space.shape))
    if isinstance(action_space, spaces.Discrete):
        return {"obs_dim": obs_dim, "act_dim": int(action_space.n), "action_low": None, "action_high": None}
    if isinstance(action_space, spaces.Box):
        return {"obs_dim": obs_dim, "act_dim": int(np.prod(action_space.shape)),
                "action_low": action_space.low.astype(np.float32).reshape(-1),
                "action_high": action_space.high.astype(np.float32).reshape(-1)}
    raise ValueError(f"action space {action_space} is not supported (only Box and Discrete)")


def env_policy_dims(env_id: str, kwargs: dict | None = None) -> dict:
    """`policy_dims` of a registered env ("module:Id" too), from one throwaway instance (no reset, no rendering):
    the driver reads it from an env of its own, so a learner can start beside the runners instead of after the
    first one is up, and a bad env id fails there, in one line (UnknownEnvError)."""
    env = make_env(env_id, None, kwargs)
    try:
        return policy_dims(env.observation_space, env.action_space)
    finally:
        env.close()

import numpy as np
from hydra.utils import instantiate

from rlfarm.config import compose
from rlfarm.rewards import EnvReward


def test_env_reward_passes_the_env_reward_through_as_float32():
    reward = EnvReward()
    reward.setup("cpu")
    assert reward.needs == ("env_reward",) and reward.frame_size is None
    out = reward({"env_reward": np.array([1.5, -2.0], dtype=np.float64)})
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [1.5, -2.0])


def test_env_config_composes_and_accepts_frame_size():
    cfg = compose("train", ["reward=env", "reward.frame_size=64"])
    reward = instantiate(cfg.reward)
    assert isinstance(reward, EnvReward) and reward.frame_size == 64

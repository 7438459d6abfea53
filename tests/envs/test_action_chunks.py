import gymnasium as gym
import numpy as np
import pytest

from rlfarm.envs.action_chunks import ActionChunkWrapper, ActionTokenizer


@pytest.mark.parametrize("method", ["quantile", "minmax"])
def test_round_trip_error_is_at_most_half_a_bin(method):
    rng = np.random.default_rng(0)
    actions = rng.normal([0.0, 2.0, -5.0], [1.0, 0.1, 3.0], size=(5000, 3))
    tokenizer = ActionTokenizer.from_data(actions, method=method)
    inside = actions[np.all((actions >= tokenizer.low) & (actions <= tokenizer.high), axis=1)]
    tokens = tokenizer.encode(inside)
    assert tokens.dtype == np.int64 and tokens.min() >= 0 and tokens.max() <= 255
    error = np.abs(tokenizer.decode(tokens) - inside)
    assert np.all(error <= tokenizer.bin_width / 2 + 1e-6)
    assert error.max() > tokenizer.bin_width.min() / 4  # the check above is not vacuous


def test_quantile_stats_clip_outliers_to_the_end_bins():
    actions = np.concatenate([np.linspace(-1, 1, 1000), [50.0, -50.0]])[:, None]
    tokenizer = ActionTokenizer.from_data(actions)
    assert tokenizer.high[0] < 1.0 and tokenizer.low[0] > -1.0  # q99/q01, not the outliers
    assert tokenizer.encode(np.array([[50.0], [-50.0]])).ravel().tolist() == [255, 0]


def test_tokens_are_monotone_and_decode_to_bin_centres():
    tokenizer = ActionTokenizer(np.array([-1.0]), np.array([1.0]), bins=256)
    values = np.linspace(-1, 1, 2001)[:, None]
    tokens = tokenizer.encode(values).ravel()
    assert np.all(np.diff(tokens) >= 0) and tokens[0] == 0 and tokens[-1] == 255
    np.testing.assert_allclose(tokenizer.decode(np.array([[0], [255]])).ravel(), [-1 + 1 / 256, 1 - 1 / 256], atol=1e-6)


def test_bad_stats_are_refused():
    with pytest.raises(ValueError):
        ActionTokenizer(np.array([1.0]), np.array([1.0]))
    with pytest.raises(ValueError):
        ActionTokenizer.from_data(np.zeros((4, 2)), method="mean")


class CountingEnv(gym.Env):
    """Reward 1 a step; success at step `succeed_at`; terminates at step `end_at`."""

    def __init__(self, succeed_at=3, end_at=6):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (1,))
        self.action_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        self.succeed_at, self.end_at, self.actions = succeed_at, end_at, []

    def reset(self, *, seed=None, options=None):
        self.t, self.actions = 0, []
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        self.actions.append(np.array(action))
        return np.array([self.t], np.float32), 1.0, self.t >= self.end_at, False, {"success": self.t == self.succeed_at}


def test_chunk_wrapper_runs_k_actions_in_order_and_sums_reward():
    env = ActionChunkWrapper(CountingEnv(), chunk_size=4)
    assert env.action_space.shape == (4, 2)
    env.reset()
    chunk = np.arange(8, dtype=np.float32).reshape(4, 2) / 10
    obs, reward, terminated, truncated, info = env.step(chunk)
    assert reward == 4.0 and obs[0] == 4 and not terminated
    assert info["steps"] == 4 and info["step_success"] == [False, False, True, False] and info["success"]
    np.testing.assert_allclose(np.stack(env.unwrapped.actions), chunk)


def test_chunk_wrapper_stops_at_termination():
    env = ActionChunkWrapper(CountingEnv(succeed_at=99, end_at=6), chunk_size=4)
    env.reset()
    env.step(np.zeros((4, 2)))
    obs, reward, terminated, _, info = env.step(np.zeros((4, 2)))
    assert terminated and reward == 2.0 and info["steps"] == 2 and info["step_success"] == [False, False]
    assert not info["success"] and len(env.unwrapped.actions) == 6

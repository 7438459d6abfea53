import gymnasium as gym
import numpy as np
import pytest

from rlfarm.envs import UnknownEnvError, VectorEnv


def pendulum_actions(steps: int, num_envs: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.uniform(-2, 2, size=(num_envs, 1)).astype(np.float32) for _ in range(steps)]


def test_truncation_yields_true_final_obs_then_reset_obs():
    """The autoreset trap: at the done step next_obs must be the final state, obs the next episode's start."""
    num_envs, horizon, seed = 2, 5, 3
    actions = pendulum_actions(2 * horizon + 2, num_envs)
    env = VectorEnv("Pendulum-v1", num_envs=num_envs, seed=seed, kwargs={"max_episode_steps": horizon})
    env.reset()
    results = [env.step(a) for a in actions]
    env.close()

    for i in range(num_envs):
        single = gym.make("Pendulum-v1", max_episode_steps=horizon)
        obs, _ = single.reset(seed=seed + i)
        for t, result in enumerate(results):
            next_obs, _, terminated, truncated, _ = single.step(actions[t][i])
            np.testing.assert_array_equal(result.next_obs[i], next_obs)
            assert result.truncated[i] == truncated and result.terminated[i] == terminated
            if truncated:
                obs, _ = single.reset()  # the vector env resets sub-envs unseeded, as here
                assert not np.allclose(result.obs[i], result.next_obs[i])
            else:
                obs = next_obs
            np.testing.assert_array_equal(result.obs[i], obs)
        single.close()
    assert [t for t, r in enumerate(results) if r.truncated.all()] == [horizon - 1, 2 * horizon - 1]


def test_outputs_dtypes_and_episode_statistics():
    env = VectorEnv("Pendulum-v1", num_envs=2, kwargs={"max_episode_steps": 4})
    obs = env.reset()
    assert obs.shape == (2, 3) and obs.dtype == np.float32
    results = [env.step(a) for a in pendulum_actions(4, 2)]
    env.close()
    last = results[-1]
    assert last.next_obs.dtype == np.float32 and last.env_reward.dtype == np.float32
    assert last.terminated.dtype == bool and last.truncated.dtype == bool
    assert last.frames is None
    assert all(r.episode_returns == [] for r in results[:-1])
    assert last.episode_lengths == [4, 4]
    expected = np.sum([r.env_reward for r in results], axis=0, dtype=np.float64)
    np.testing.assert_allclose(last.episode_returns, expected, rtol=1e-5)


def test_pendulum_frames_shape_dtype_and_change():
    env = VectorEnv("Pendulum-v1", num_envs=2, frame_size=32)
    env.reset()
    first, second = (env.step(np.full((2, 1), 2.0, np.float32)).frames for _ in range(2))
    env.close()
    assert first.shape == (2, 32, 32, 3) and first.dtype == np.uint8
    assert not np.array_equal(first, second)


def test_halfcheetah_done_step_frame_shows_final_state_headless():
    """The frame at a truncation is the final state's: equal to the frame of an env that did not reset."""
    actions = [np.random.default_rng(t).uniform(-1, 1, (1, 6)).astype(np.float32) for t in range(3)]
    frames = {}
    for horizon in (3, 100):
        env = VectorEnv("HalfCheetah-v5", frame_size=32, kwargs={"max_episode_steps": horizon})
        env.reset()
        result = [env.step(a) for a in actions][-1]
        env.close()
        assert result.truncated[0] == (horizon == 3)
        frames[horizon] = result.frames
    assert frames[3].shape == (1, 32, 32, 3) and frames[3].dtype == np.uint8
    np.testing.assert_array_equal(frames[3], frames[100])


def test_each_mujoco_sub_env_renders_its_own_state():
    """Sub-envs own separate GL contexts; each frame must match a lone env with the same seed and actions."""
    actions = [np.random.default_rng(t).uniform(-1, 1, (2, 6)).astype(np.float32) for t in range(5)]
    env = VectorEnv("HalfCheetah-v5", num_envs=2, seed=0, frame_size=24)
    env.reset()
    together = [env.step(a) for a in actions][-1].frames
    env.close()
    assert not np.array_equal(together[0], together[1])
    for i in range(2):
        alone = VectorEnv("HalfCheetah-v5", num_envs=1, seed=i, frame_size=24)
        alone.reset()
        frame = [alone.step(a[i : i + 1]) for a in actions][-1].frames[0]
        alone.close()
        np.testing.assert_array_equal(together[i], frame)


def test_unknown_env_id_names_closest_ids_and_the_fix():
    with pytest.raises(UnknownEnvError) as error:
        VectorEnv("HalfCheeta-v5")
    message = str(error.value)
    assert "\n" not in message
    assert "'HalfCheeta-v5'" in message and "HalfCheetah-v5" in message
    assert "env=pendulum|halfcheetah or env.id=<gymnasium id>" in message


def test_mujoco_warnings_go_to_logging_not_a_log_file_in_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    VectorEnv("HalfCheetah-v5").close()  # its model warns on load under MuJoCo 4
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()

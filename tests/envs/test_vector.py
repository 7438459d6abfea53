import glob
import os
import subprocess
import sys
import threading

import gymnasium as gym
import numpy as np
import psutil
import pytest

from rlfarm.envs import UnknownEnvError, VectorEnv
from rlfarm.envs.workers import EnvWorkerError


def pendulum_actions(steps: int, num_envs: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.uniform(-2, 2, size=(num_envs, 1)).astype(np.float32) for _ in range(steps)]


@pytest.mark.parametrize("workers", [0, 2])
def test_truncation_yields_true_final_obs_then_reset_obs(workers):
    """The autoreset trap: at the done step next_obs must be the final state, obs the next episode's start."""
    num_envs, horizon, seed = 2, 5, 3
    actions = pendulum_actions(2 * horizon + 2, num_envs)
    env = VectorEnv("Pendulum-v1", num_envs=num_envs, seed=seed, kwargs={"max_episode_steps": horizon},
                    workers=workers)
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


@pytest.mark.parametrize("workers", [0, 1])
def test_halfcheetah_done_step_frame_shows_final_state_headless(workers):
    """The frame at a truncation is the final state's: equal to the frame of an env that did not reset."""
    actions = [np.random.default_rng(t).uniform(-1, 1, (1, 6)).astype(np.float32) for t in range(3)]
    frames = {}
    for horizon in (3, 100):
        env = VectorEnv("HalfCheetah-v5", frame_size=32, kwargs={"max_episode_steps": horizon}, workers=workers)
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


def fill_rows(workers: int, steps: int = 6, num_envs: int = 3, batch_render: bool = False,
              frame_size: int = 16, frame_stack: int = 1) -> tuple[dict, list]:
    """`steps` vector steps of HalfCheetahs (episodes of 4 steps, so one ends inside) written in place."""
    env = VectorEnv("HalfCheetah-v5", num_envs=num_envs, seed=7, frame_size=frame_size,
                    kwargs={"max_episode_steps": 4}, workers=workers, batch_render=batch_render,
                    frame_stack=frame_stack)
    rows = env.step_buffers(steps)
    env.reset_into(rows)
    episodes = []
    for t in range(steps):
        rows.action[t] = np.random.default_rng(t).uniform(-1, 1, (num_envs, 6))
        episodes.append(env.step_into(rows, t))
    arrays = {name: getattr(rows, name).copy()
              for name in ("obs", "action", "next_obs", "env_reward", "terminated", "truncated", "frames")}
    env.close()
    return arrays, episodes


def test_worker_processes_write_the_same_rows_as_one_process():
    """Sub-envs split over 2 worker processes (groups of 2 and 1) give the transitions, frames and episode ends
    of the same sub-envs stepped in this process, through the shared step buffers."""
    alone, alone_episodes = fill_rows(workers=0)
    split, split_episodes = fill_rows(workers=2)
    assert alone["truncated"][3].all() and not alone["truncated"][[0, 1, 2, 4, 5]].any()
    assert alone_episodes[3][1] == [4, 4, 4]
    for name, array in alone.items():
        np.testing.assert_array_equal(split[name], array, err_msg=name)
    assert split_episodes == alone_episodes
    # At the done step: next_obs is the final state, obs[t + 1] the reset state; elsewhere they agree.
    assert not np.allclose(alone["next_obs"][3], alone["obs"][4])
    np.testing.assert_array_equal(alone["next_obs"][2], alone["obs"][3])


@pytest.mark.parametrize("workers", [0, 2])
def test_batch_render_draws_the_frames_of_one_context_per_sub_env(workers):
    """Tiles of one buffer (5 sub-envs: a 3×2 grid in process, 2×2 and 2×1 with 2 workers) show what each
    sub-env's own GL context shows, the done step (3) included. Software GL rasterises a few edge pixels of a
    tile off the buffer's origin 1 level differently (measured: ~0.2 % of values), so: the origin tile of each
    process exact, every value within 1, and under 1 % of them off; everything but the frames exact."""
    alone, alone_episodes = fill_rows(workers=0, num_envs=5, frame_size=32)
    tiled, tiled_episodes = fill_rows(workers=workers, num_envs=5, batch_render=True, frame_size=32)
    assert alone["truncated"][3].all() and tiled_episodes == alone_episodes
    for name, array in alone.items():
        if name != "frames":
            np.testing.assert_array_equal(tiled[name], array, err_msg=name)
    origin_tiles = [0] if workers == 0 else [0, 3]
    np.testing.assert_array_equal(tiled["frames"][:, origin_tiles], alone["frames"][:, origin_tiles])
    off = np.abs(tiled["frames"].astype(np.int16) - alone["frames"])
    assert off.max() <= 1 and (off > 0).mean() < 0.01
    assert not np.array_equal(tiled["frames"][3], tiled["frames"][4])  # the reset state is not drawn at the done step


def test_stacked_pendulum_frames_end_with_the_unstacked_frame():
    def frames(stack):
        env = VectorEnv("Pendulum-v1", 2, seed=3, frame_size=16, kwargs={"max_episode_steps": 3}, frame_stack=stack)
        env.reset()
        out = np.stack([env.step(a).frames for a in pendulum_actions(5, 2)])
        env.close()
        return out

    stacked, plain = frames(2), frames(1)
    assert stacked.shape == (5, 2, 16, 16, 6)
    np.testing.assert_array_equal(stacked[..., 3:], plain)
    np.testing.assert_array_equal(stacked[1, ..., :3], plain[0])


@pytest.mark.parametrize("workers, batch_render", [(0, False), (2, True)])
def test_stacked_frames_hold_the_render_before_the_step(workers, batch_render):
    """frame_stack=2: channels 0..2 are the step before's render, and at an episode's first step (4: after the done
    step 3) the reset state's render, which no unstacked frame shows (MuJoCo: in worker processes and as tiles)."""
    stacked, _ = fill_rows(workers=workers, batch_render=batch_render, frame_stack=2)
    assert stacked["frames"].shape == (6, 3, 16, 16, 6)
    for t in (1, 2, 3, 5):
        np.testing.assert_array_equal(stacked["frames"][t, ..., :3], stacked["frames"][t - 1, ..., 3:])
    assert not np.array_equal(stacked["frames"][4, ..., :3], stacked["frames"][3, ..., 3:])  # the reset state
    assert not np.array_equal(stacked["frames"][0, ..., :3], stacked["frames"][0, ..., 3:])  # the start state


def test_batch_render_steps_on_another_thread_than_the_one_that_built_it():
    """A threaded Ray actor (the env runner) builds its env on one thread and collects on another."""
    env = VectorEnv("HalfCheetah-v5", num_envs=2, frame_size=16, batch_render=True)
    env.reset()
    frames = []
    stepper = threading.Thread(target=lambda: frames.append(env.step(np.zeros((2, 6), np.float32)).frames))
    stepper.start()
    stepper.join(60)
    frames.append(env.step(np.zeros((2, 6), np.float32)).frames)
    env.close()
    assert len(frames) == 2 and frames[0].std() > 0 and frames[1].shape == (2, 16, 16, 3)


def test_batch_render_leaves_non_mujoco_envs_on_their_own_renderer():
    frames = []
    for batch_render in (False, True):
        env = VectorEnv("Pendulum-v1", num_envs=2, frame_size=32, batch_render=batch_render)
        env.reset()
        frames.append([env.step(a).frames for a in pendulum_actions(3, 2)])
        env.close()
    np.testing.assert_array_equal(frames[0], frames[1])
    assert frames[1][0].shape == (2, 32, 32, 3)


def test_step_buffers_leave_no_shared_file_behind():
    before = set(glob.glob("/dev/shm/rlfarm-steps-*"))
    env = VectorEnv("Pendulum-v1", num_envs=2, workers=1)
    rows = env.step_buffers(4)
    assert set(glob.glob("/dev/shm/rlfarm-steps-*")) == before  # mapped by both sides, its name already gone
    env.reset_into(rows)
    assert np.abs(rows.obs[0]).sum() > 0
    env.close()


def test_a_dead_worker_is_an_error_naming_its_sub_envs_not_a_hang():
    env = VectorEnv("Pendulum-v1", num_envs=3, workers=2)
    env.reset()
    # the env's own worker processes, in sub-env order (not "the newest children": pids wrap, and this process
    # may have other children, such as the shared Ray cluster of tests/helpers.py)
    (first, second) = [psutil.Process(worker.process.pid) for group in env._workers for worker in group]
    second.kill()
    second.wait(10)
    with pytest.raises(EnvWorkerError, match=r"sub-envs 2\.\.2 exited"):
        env.step(np.zeros((3, 1), np.float32))
    env.close()
    assert not first.is_running() or first.status() == psutil.STATUS_ZOMBIE


def test_more_workers_than_sub_envs_is_refused():
    with pytest.raises(ValueError, match=r"workers must be in \[0, num_envs=2\]"):
        VectorEnv("Pendulum-v1", num_envs=2, workers=3)


def test_importing_the_envs_sets_nothing_in_the_environment_and_building_one_renders_headless():
    """Rendering's settings are made by the code that renders (`headless_rendering`), not as a side effect of an
    import: a process that imports rlfarm.envs (or the runner) keeps its environment as it was."""
    script = ("import os, sys; import rlfarm.envs, rlfarm.envs.vector, rlfarm.roles.env_runner; "
              "assert not {'MUJOCO_GL', 'SDL_VIDEODRIVER', 'LP_NUM_THREADS'} & set(os.environ), 'set at import'; "
              "env = rlfarm.envs.VectorEnv('Pendulum-v1', 1, frame_size=8); env.reset(); env.close(); "
              "print(os.environ['MUJOCO_GL'], os.environ['SDL_VIDEODRIVER'])")
    clean = {k: v for k, v in os.environ.items() if k not in ("MUJOCO_GL", "SDL_VIDEODRIVER", "LP_NUM_THREADS")}
    done = subprocess.run([sys.executable, "-c", script], env=clean, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["egl", "dummy"]

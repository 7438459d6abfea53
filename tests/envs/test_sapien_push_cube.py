import numpy as np
import pytest

pytest.importorskip("sapien", reason="SAPIEN is an optional extra: pip install -e .[sim]")

from rlfarm.envs.action_chunks import ActionChunkWrapper  # noqa: E402
from rlfarm.envs.sapien_tasks import DIRECTIONS, SapienPushCube, instruction_vocabulary  # noqa: E402


def _seed_for(env, direction):
    for seed in range(200):
        _, info = env.reset(seed=seed)
        if info["direction"] == direction:
            return seed
    raise AssertionError(direction)


@pytest.fixture(scope="module")
def env():
    return SapienPushCube()


def test_observations_match_their_spaces(env):
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    assert obs["image"].shape == (3, 32, 32) and obs["image"].dtype == np.uint8
    assert info["direction"] in obs["instruction"]
    assert set(obs["instruction"].split()) <= set(instruction_vocabulary())
    for channel in range(3):  # pusher, cube and goal are each drawn
        assert obs["image"][channel].any()


def test_same_seed_same_start_and_instruction(env):
    first, _ = env.reset(seed=7)
    second, _ = env.reset(seed=7)
    np.testing.assert_array_equal(first["state"], second["state"])
    assert first["instruction"] == second["instruction"]


@pytest.mark.parametrize("direction", sorted(DIRECTIONS))
def test_pushing_along_the_instruction_succeeds_and_the_opposite_fails(env, direction):
    seed = _seed_for(env, direction)
    push = np.array(DIRECTIONS[direction], np.float32)
    for action, should_succeed in ((push, True), (-push, False)):
        obs, _ = env.reset(seed=seed)
        start = obs["state"][2:4].copy()
        for _ in range(env.max_steps):
            obs, reward, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
        assert info["success"] is should_succeed and terminated is should_succeed and reward == float(should_succeed)
        assert truncated is not should_succeed
    moved = obs["state"][2:4] - start  # the opposite push left the cube where it was: the pusher moved away
    assert np.linalg.norm(moved) < 0.005


def test_chunked_push_reports_per_step_success(env):
    seed = _seed_for(env, "right")
    chunked = ActionChunkWrapper(env, chunk_size=4)
    chunked.reset(seed=seed)
    _, reward, terminated, _, info = chunked.step(np.tile([1.0, 0.0], (4, 1)))
    assert terminated and reward == 1.0 and info["step_success"][-1] and not any(info["step_success"][:-1])
    assert info["steps"] < 4  # it stopped when the cube arrived


def test_occupancy_image_moves_with_the_cube(env):
    seed = _seed_for(env, "right")
    obs, _ = env.reset(seed=seed)
    before = np.argwhere(obs["image"][1])[:, 1].mean()
    obs, *_ = env.step(np.array([1.0, 0.0]))
    obs, *_ = env.step(np.array([1.0, 0.0]))
    assert np.argwhere(obs["image"][1])[:, 1].mean() > before + 1  # columns grow to the right (+x)

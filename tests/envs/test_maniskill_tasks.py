"""ManiSkill3 tasks through a camera (rlfarm/envs/maniskill_tasks.py): shapes, seeding, lazy pictures, success.
They render with Vulkan: Mesa >= 23 lavapipe on a CPU machine, which scripts/install.sh installs."""
import numpy as np
import pytest

pytest.importorskip("mani_skill", reason="ManiSkill3 is in the sim extra: pip install -e .[sim]")

from rlfarm.envs.action_chunks import ActionChunkWrapper  # noqa: E402
from rlfarm.envs.maniskill_tasks import TASKS, ManiSkillTask, rendering_problem  # noqa: E402
from rlfarm.envs.vla_tasks import check_vla_task, instruction_vocabulary, make_vla_task  # noqa: E402
from rlfarm.errors import ConfigError  # noqa: E402

SIZE = 64
# pytest shows warnings the module silences (mani_skill's per-step np.isnan on a tensor under NumPy 2)
pytestmark = pytest.mark.filterwarnings("ignore:__array_wrap__ must accept context:DeprecationWarning")


@pytest.fixture(scope="module")
def renders():
    problem = rendering_problem("cpu")
    if problem:
        pytest.skip(problem)


@pytest.fixture(scope="module")
def env(renders):
    env = make_vla_task("PushCube-v1", image_size=SIZE, max_steps=30, render_device="cpu")
    yield env
    env.close()


def _toward(target, tcp) -> np.ndarray:
    """A pd_ee_delta_pos action that moves the gripper (closed) toward target: ±1 is a 0.1 m step."""
    return np.append(np.clip((target - tcp) / 0.1, -1, 1), -1.0).astype(np.float32)


def _scripted_push(env, seed: int, forward: bool = True):
    """Lower the gripper behind the cube, then push it toward the target (or away from it). Returns the last
    step's (obs, reward, terminated, truncated, info) and the number of steps taken."""
    obs, _ = env.reset(seed=seed)
    cube, goal = env.base.obj.pose.p[0].numpy(), env.base.goal_region.pose.p[0].numpy()
    side = -1.0 if forward else 1.0  # behind the cube as seen from where it should go
    waypoints = [(8, cube + [side * 0.06, 0, 0.05]), (6, cube + [side * 0.05, 0, 0.0])]
    target = goal + [0, 0, cube[2]] if forward else cube + [-0.3, 0, 0]
    plan = [t for steps, t in waypoints for _ in range(steps)]
    for step in range(env.max_steps):
        result = env.step(_toward(plan[step] if step < len(plan) else target, obs["proprio"][:3]))
        obs = result[0]
        if result[2] or result[3]:
            return result, step + 1
    raise AssertionError("the episode did not end by max_steps")


def test_observations_have_the_workers_shapes_and_an_instruction(env):
    obs, info = env.reset(seed=0)
    assert set(obs) == {"image", "proprio", "instruction"} and info == {"success": False}
    assert env.observation_space.contains(dict(obs))
    assert obs["image"].shape == (3, SIZE, SIZE) and obs["image"].dtype == np.uint8
    assert obs["image"].std() > 10  # a real picture: table, arm and target, not a blank frame
    assert obs["proprio"].shape == (5,) and obs["proprio"].dtype == np.float32 and np.isfinite(obs["proprio"]).all()
    assert obs["instruction"] in TASKS["PushCube-v1"]
    assert set(obs["instruction"].split()) <= set(instruction_vocabulary("PushCube-v1"))
    space = env.action_space
    assert space.shape == (4,) and space.dtype == np.float32 and (space.low == -1).all() and (space.high == 1).all()


def test_same_seed_same_start_picture_and_instruction(env):
    first, _ = env.reset(seed=7)
    first = dict(first)
    second = dict(env.reset(seed=7)[0])
    np.testing.assert_array_equal(first["image"], second["image"])
    np.testing.assert_array_equal(first["proprio"], second["proprio"])
    assert first["instruction"] == second["instruction"]
    other = dict(env.reset(seed=8)[0])
    assert np.abs(other["image"].astype(int) - first["image"]).max() > 50  # the cube starts elsewhere


def test_actions_move_the_gripper_and_the_picture_follows(env):
    obs, _ = env.reset(seed=1)
    before, image = obs["proprio"].copy(), obs["image"]
    for _ in range(3):
        obs, reward, terminated, truncated, info = env.step(np.array([0, 0, 1, -1], np.float32))  # up
    assert obs["proprio"][2] - before[2] > 0.05 and abs(obs["proprio"][0] - before[0]) < 0.02
    assert reward == 0.0 and not terminated and not truncated and info == {"success": False}
    assert (obs["image"] != image).any()


def test_a_picture_read_after_the_env_moved_on_raises(env):
    obs, _ = env.reset(seed=2)
    env.step(np.zeros(4, np.float32))
    with pytest.raises(RuntimeError, match="before stepping again"):
        obs["image"]
    assert obs["instruction"]  # the other fields stay readable


def test_pushing_onto_the_target_succeeds_and_pushing_away_truncates(env):
    (obs, reward, terminated, truncated, info), steps = _scripted_push(env, seed=3)
    assert reward == 1.0 and terminated and not truncated and info["success"] and steps < env.max_steps
    (obs, reward, terminated, truncated, info), steps = _scripted_push(env, seed=3, forward=False)
    assert reward == 0.0 and not terminated and truncated and not info["success"] and steps == env.max_steps


def test_action_chunks_run_k_steps_and_return_the_last_picture(env):
    chunked = ActionChunkWrapper(env, chunk_size=5)
    obs, _ = chunked.reset(seed=4)
    obs, reward, terminated, truncated, info = chunked.step(np.zeros((5, 4), np.float32))
    assert info["steps"] == 5 and info["step_success"] == [False] * 5 and env.steps == 5
    assert obs["image"].shape == (3, SIZE, SIZE)


def test_pick_cube_shows_its_goal_only_when_asked(renders):
    pictures = []
    for show_goal in (True, False):
        env = ManiSkillTask("PickCube-v1", image_size=SIZE, render_device="cpu", show_goal=show_goal)
        obs, _ = env.reset(seed=5)
        pictures.append(obs["image"])
        assert obs["instruction"] in TASKS["PickCube-v1"]
        env.close()
    shown, hidden = pictures
    green = (shown[1].astype(int) - shown[0] > 60) & (shown[1].astype(int) - shown[2] > 60)  # the goal sphere
    assert green.sum() > 3 and (shown != hidden).any(axis=0).sum() >= green.sum()


def test_joint_control_is_selectable(renders):
    env = ManiSkillTask("PushCube-v1", image_size=32, render_device="cpu", control_mode="pd_joint_delta_pos")
    obs, _ = env.reset(seed=6)
    before = obs["proprio"].copy()
    obs = env.step(np.array([0, 1, 0, 0, 0, 0, 0, -1], np.float32))[0]  # shoulder joint forward
    assert env.action_space.shape == (8,) and np.abs(obs["proprio"][:3] - before[:3]).max() > 0.005
    env.close()


def test_unknown_task_is_a_one_line_config_error():
    with pytest.raises(ConfigError, match="unknown VLA task 'PushCub-v1'"):
        check_vla_task("PushCub-v1")

"""Batched ManiSkill3 tasks (rlfarm/envs/maniskill_gpu.py). On CPU machines ManiSkill's CPU backend holds one scene,
so the interface (shapes, seeding, chunks, success and episode ends, held envs) is tested with num_envs=1 against
`ManiSkillTask`; GRPO groups of scenes that start alike need GPU simulation (a `gpu` test)."""
import numpy as np
import pytest
import torch

from rlfarm.envs.maniskill_gpu import gather_states, group_leaders

SIZE = 32
pytestmark = pytest.mark.filterwarnings("ignore:__array_wrap__ must accept context:DeprecationWarning")


def test_each_env_copies_the_first_env_of_its_seed():
    assert group_leaders([7, 7, 3, 3, 7, 9]).tolist() == [0, 0, 2, 2, 0, 5]
    assert group_leaders(range(4)).tolist() == [0, 1, 2, 3]


def test_states_are_gathered_row_wise_through_nested_dicts():
    state = {"actors": {"cube": torch.arange(8.0).view(4, 2)}, "articulations": {"panda": torch.arange(4.0)[:, None]}}
    gathered = gather_states(state, torch.tensor([0, 0, 2, 2]))
    assert gathered["actors"]["cube"].tolist() == [[0, 1], [0, 1], [4, 5], [4, 5]]
    assert gathered["articulations"]["panda"].flatten().tolist() == [0, 0, 2, 2]


@pytest.fixture(scope="module")
def renders():
    pytest.importorskip("mani_skill", reason="ManiSkill3 is in the sim extra: pip install -e .[sim]")
    from rlfarm.envs.maniskill_tasks import rendering_problem

    problem = rendering_problem("cpu")
    if problem:
        pytest.skip(problem)


@pytest.fixture(scope="module")
def tasks(renders):
    from rlfarm.envs.maniskill_gpu import ManiSkillGPUTasks

    tasks = ManiSkillGPUTasks("PushCube-v1", num_envs=1, image_size=SIZE, max_steps=30, render_device="cpu",
                              sim_backend="cpu")
    yield tasks
    tasks.close()


def _toward(target, tcp) -> torch.Tensor:
    """A pd_ee_delta_pos action toward target with the gripper closed (±1 is a 0.1 m step)."""
    return torch.cat([((target - tcp) / 0.1).clamp(-1, 1), torch.tensor([-1.0])])


@pytest.mark.slow
def test_observations_are_stacked_maniskill_task_observations(tasks):
    from rlfarm.envs.maniskill_tasks import ManiSkillTask

    single = ManiSkillTask("PushCube-v1", image_size=SIZE, max_steps=30, render_device="cpu")
    try:
        for seed in (5, 11):
            obs, (expected, _) = tasks.reset([seed]), single.reset(seed=seed)
            assert obs.image.shape == (1, 3, SIZE, SIZE) and obs.image.dtype == torch.uint8
            assert obs.proprio.shape == (1, 5) and obs.proprio.dtype == torch.float32
            # the same start, picture and instruction as the one-scene task reset with that seed
            assert np.array_equal(obs.image[0].numpy(), expected["image"])
            assert np.allclose(obs.proprio[0].numpy(), expected["proprio"])
            assert obs.instructions == [expected["instruction"]]
        assert obs.image.float().std() > 10  # a real picture
    finally:
        single.close()


def test_chunks_count_steps_and_end_episodes_at_max_steps(tasks):
    first = tasks.reset([3])
    assert not tasks.done.any() and tasks.observations().image.equal(first.image)
    hold = torch.zeros(1, 8, tasks.action_dim)
    result = tasks.step_chunk(hold, live=[False])  # not live: nothing runs
    assert result.steps.tolist() == [0] and tasks.episode_steps.tolist() == [0] and not result.done.any()
    steps = []
    for _ in range(4):
        result = tasks.step_chunk(torch.rand(1, 8, tasks.action_dim) * 2 - 1)
        steps.append(int(result.steps))
    assert steps == [8, 8, 8, 6]  # 30 steps: the last chunk stops at max_steps
    assert result.done.tolist() == [True] and result.success.tolist() == [False]
    assert tasks.step_chunk(hold).steps.tolist() == [0]  # an ended episode runs no more steps
    assert not tasks.reset([3]).image.equal(result.obs.image)  # reset shows the start again
    assert tasks.observations().image.equal(first.image)


def test_pushing_the_cube_onto_the_target_succeeds_and_ends_the_episode(tasks):
    obs = tasks.reset([0])
    cube, goal = tasks.base.obj.pose.p[0].clone(), tasks.base.goal_region.pose.p[0].clone()
    plan = [cube + torch.tensor([-0.06, 0, 0.05])] * 8 + [cube + torch.tensor([-0.05, 0, 0.0])] * 6
    for step in range(30):
        target = plan[step] if step < len(plan) else goal + torch.tensor([0, 0, float(cube[2])])
        result = tasks.step_chunk(_toward(target, obs.proprio[0, :3]).view(1, 1, -1))
        obs = result.obs
        if result.done.all():
            break
    assert result.success.tolist() == [True] and result.done.tolist() == [True]
    assert int(tasks.episode_steps) < 30  # ended on the success step, before max_steps


def test_bad_arguments_are_refused(tasks):
    from rlfarm.envs.maniskill_gpu import ManiSkillGPUTasks

    with pytest.raises(ValueError, match="seeds"):
        tasks.reset([1, 2])
    with pytest.raises(ValueError, match="actions must be"):
        tasks.step_chunk(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="num_envs must be 1"):
        ManiSkillGPUTasks("PushCube-v1", num_envs=4, sim_backend="cpu")
    with pytest.raises(ValueError, match="task must be one of"):
        ManiSkillGPUTasks("OpenCabinetDrawer-v1", num_envs=1, sim_backend="cpu")


@pytest.mark.gpu
def test_gpu_scenes_of_one_seed_start_alike(renders):
    from rlfarm.envs.maniskill_gpu import ManiSkillGPUTasks, physx_gpu_library

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if not physx_gpu_library().exists():
        pytest.skip(f"no PhysX GPU library at {physx_gpu_library()}")
    tasks = ManiSkillGPUTasks("PickCube-v1", num_envs=16, image_size=SIZE, max_steps=10, sim_backend="gpu")
    try:
        obs = tasks.reset([i // 4 for i in range(16)])
        assert obs.image.shape == (16, 3, SIZE, SIZE) and obs.image.is_cuda
        for group in range(4):
            members = slice(4 * group, 4 * group + 4)
            assert (obs.image[members] == obs.image[4 * group]).all()
            assert torch.allclose(obs.proprio[members], obs.proprio[4 * group].expand(4, -1))
            assert len(set(obs.instructions[members])) == 1
        assert not obs.image[0].equal(obs.image[4])  # other seeds, other starts
        result = tasks.step_chunk(torch.rand(16, 5, tasks.action_dim, device="cuda") * 2 - 1)
        assert result.steps.tolist() == [5] * 16 and result.obs.image.is_cuda
    finally:
        tasks.close()

"""EnvRunner: the chunks it fills in place (in-process and with worker processes), its stage times, and weights
riding on an ack. In-process where no Ray is needed; one module-scoped Ray for the credit/ack path."""
import numpy as np
import pytest
import torch

from helpers import TINY_SAC, read_summary, train, wait_for
from rlfarm.roles.env_runner import EnvRunner
from rlfarm.roles.labeler import Labeler
from rlfarm.sync.object_store import publication

ACTOR = {"_target_": "rlfarm.models.mlp.SquashedGaussianActor", "_partial_": True, "hidden": [16, 16]}
HALFCHEETAH = {"id": "HalfCheetah-v5", "num_envs": 3, "kwargs": {"max_episode_steps": 4}}
CHUNK_STEPS = 6


@pytest.fixture(autouse=True)
def _software_render_threads(monkeypatch):
    """The runner sets LP_NUM_THREADS for its process; here that process is pytest's: undo it afterwards."""
    monkeypatch.setenv("LP_NUM_THREADS", "2")


def runner(env_cfg: dict, needs=("env_reward", "frames"), frame_size=16, random_steps=0) -> EnvRunner:
    return EnvRunner(0, env_cfg, ACTOR, list(needs), frame_size, seed=3, chunk_steps=CHUNK_STEPS, credits=2,
                     random_steps=random_steps, threads=1)


def two_chunks(workers: int, groups: int = 1, random_steps: int = 0) -> list[dict]:
    """Two chunks (the second shorter) of a fresh runner acting with its policy (or at random for random_steps);
    copies, as ray.put makes them."""
    acting = runner({**HALFCHEETAH, "workers": workers, "groups": groups}, random_steps=random_steps)
    chunks = [{k: v.copy() for k, v in acting.collect(steps).items()} for steps in (CHUNK_STEPS, 2)]
    acting.close()
    return chunks


def test_chunk_fields_shapes_and_transitions_across_an_episode_end():
    first, second = two_chunks(workers=0)
    n = 3 * CHUNK_STEPS
    shapes = {"obs": (n, 17), "next_obs": (n, 17), "action": (n, 6), "terminated": (n,), "truncated": (n,),
              "env_reward": (n,), "frames": (n, 16, 16, 3)}
    assert {k: v.shape for k, v in first.items()} == shapes
    assert first["frames"].dtype == np.uint8 and first["obs"].dtype == np.float32
    assert second["obs"].shape == (6, 17)
    steps = first["obs"].reshape(CHUNK_STEPS, 3, 17), first["next_obs"].reshape(CHUNK_STEPS, 3, 17)
    done = first["truncated"].reshape(CHUNK_STEPS, 3)
    assert done[3].all() and done.sum() == 3  # the 4-step episodes end inside the chunk
    for t in range(CHUNK_STEPS - 1):
        same = np.isclose(steps[1][t], steps[0][t + 1]).all(axis=-1)
        np.testing.assert_array_equal(same, ~done[t])  # obs follows next_obs except where an episode ended
    # The second chunk starts where the first ended.
    np.testing.assert_array_equal(second["obs"][:3], first["next_obs"][-3:])
    assert not np.array_equal(first["frames"][9], first["frames"][12])  # the final state, not the reset state


def test_worker_processes_give_the_chunks_of_one_process():
    """Same seeds, same policy: sub-envs in 2 worker processes give the chunks of the in-process runner, the
    episode end inside the chunk and the frames of its done steps included."""
    alone, split = two_chunks(workers=0), two_chunks(workers=2)
    for chunk_alone, chunk_split in zip(alone, split):
        assert chunk_alone.keys() == chunk_split.keys()
        for key in chunk_alone:
            np.testing.assert_array_equal(chunk_split[key], chunk_alone[key], err_msg=key)


@pytest.mark.parametrize("workers", [0, 2])
def test_double_buffered_groups_give_the_chunks_of_one_group(workers):
    """groups=2 (one half's forward while the other half steps) changes the order of the work, not the transitions:
    random actions draw the same numbers in the same order, so the chunks match groups=1 exactly."""
    alone, grouped = two_chunks(0, random_steps=10**6), two_chunks(workers, groups=2 if workers else 3, random_steps=10**6)
    for chunk_alone, chunk_grouped in zip(alone, grouped):
        for key in chunk_alone:
            np.testing.assert_array_equal(chunk_grouped[key], chunk_alone[key], err_msg=key)


def test_stage_times_grow_with_collecting():
    acting = runner({"id": "Pendulum-v1", "num_envs": 2, "kwargs": {}})
    before = acting.stats()["stage_s"]
    assert set(before) == {"act", "step", "render", "credit_wait", "send"}
    acting.collect(CHUNK_STEPS)
    after = acting.stats()["stage_s"]
    acting.close()
    assert all(after[stage] > before[stage] for stage in ("act", "step", "render"))


def test_a_publication_riding_on_an_ack_is_loaded_before_the_next_chunk():
    acting = runner({"id": "Pendulum-v1", "num_envs": 2, "kwargs": {}}, needs=("env_reward",), frame_size=None)
    state = {k: torch.full_like(v, 0.25) for k, v in acting.policy.state_dict().items()}
    acting.ack([], publication(state, 4))
    assert acting.receive_weights(publication(state, 3)) == 4  # an older publication changes nothing
    acting.collect(1)
    acting.close()
    assert acting.weights.version == 4 and acting.stats()["policy_version"] == 4
    for key, value in acting.policy.state_dict().items():
        torch.testing.assert_close(value, state[key])


def test_a_need_the_runner_cannot_record_is_refused():
    with pytest.raises(ValueError, match=r"needs \['frames'\].*frames need a frame_size"):
        runner({"id": "Pendulum-v1", "num_envs": 1, "kwargs": {}}, needs=("frames",), frame_size=None)


def test_on_ray_credits_acks_with_weights_and_stage_times(ray_cpu):
    """A runner with worker processes spends its credits, waits (credit_wait grows), and on an ack that carries
    weights loads them before its next chunk."""
    ray = ray_cpu
    acting = ray.remote(EnvRunner).options(max_concurrency=4).remote(
        0, {"id": "Pendulum-v1", "num_envs": 2, "workers": 2, "kwargs": {}}, ACTOR, ["env_reward"], None, 0,
        CHUNK_STEPS, 2, 0, 1)
    # A real labeler with no learner: it takes the chunks and nothing ever comes back but our own acks.
    labeler = ray.remote(Labeler).options(max_concurrency=4).remote(0, {"_target_": "rlfarm.rewards.env.EnvReward"},
                                                                    64, 10.0, 1)
    ray.get(acting.set_labelers.remote([labeler]))
    done = acting.run.remote(10_000)
    assert wait_for(lambda: ray.get(acting.stats.remote())["in_flight"] == 2, 30)
    waited = ray.get(acting.stats.remote())["stage_s"]
    assert wait_for(lambda: ray.get(acting.stats.remote())["stage_s"]["credit_wait"] > waited["credit_wait"], 10)
    assert waited["send"] > 0 and waited["step"] > 0 and waited["act"] > 0
    state = {k: torch.zeros(v.shape) for k, v in _actor_state().items()}
    ray.get(acting.ack.remote([0], publication(state, 1)))
    assert wait_for(lambda: ray.get(acting.stats.remote())["chunks"] == 3, 30)
    assert ray.get(acting.stats.remote())["policy_version"] == 1
    ray.get(acting.stop.remote())
    assert ray.get(done, timeout=30)["chunks"] == 3


def _actor_state() -> dict:
    from hydra.utils import instantiate

    return instantiate(ACTOR)(3, 1, np.array([-2.0], np.float32), np.array([2.0], np.float32)).state_dict()


def test_train_with_sub_envs_in_worker_processes_accounts_every_transition(tmp_path):
    """The whole pipeline with 4 sub-envs per runner stepped by 2 worker processes, HalfCheetah frames rendered
    (the env reward does not read them) and 50-step episodes ending inside chunks: produced = labeled = stored."""
    run_dir = tmp_path / "run"
    out = train(run_dir, "env=halfcheetah", "env.num_envs=4", "env.workers=2", "+env.kwargs.max_episode_steps=50",
                "reward.frame_size=32", "total_env_steps=512", *TINY_SAC, "algo.learning_starts=128")
    assert out.returncode == 0, out.stderr[-2000:]
    summary = read_summary(run_dir)
    assert summary["transitions_produced"] == summary["transitions_labeled"] == summary["transitions_stored"] == 512
    assert summary["episode_return_mean"] is not None  # episodes ended and were counted

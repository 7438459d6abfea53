"""The PPO family's roles: the rollout runner (shapes, truncation bootstrap, episodes running on across
rollouts) and the PPO learner (update, versioned weights that reach the runners, checkpoints), on real envs
and, where weights travel, real Ray actors."""
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlfarm.algos.ppo_trainer import PPOConfig, flatten_for_update, ppo_loss
from rlfarm.config import compose
from rlfarm.envs.vector import VectorEnv
from rlfarm.loops.deadlines import WATCH
from rlfarm.roles.ppo_learner import PPOLearner
from rlfarm.roles.rollout import RolloutRunner


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny MLPs: threads only add overhead


def ppo_cfg(env: str, *overrides: str):
    return compose("train", ["algo=ppo", f"env={env}", *overrides])


def runner_for(cfg, seed: int = 3, steps: int = 12) -> RolloutRunner:
    return RolloutRunner(0, OmegaConf.to_container(cfg.env), OmegaConf.to_container(cfg.model.actor), seed, steps, 1)


def test_rollout_shapes_and_episodes_running_on_across_rollouts():
    runner = runner_for(ppo_cfg("cartpole", "env.num_envs=3"), steps=7)
    rollout, episodes = runner.collect()
    assert rollout.obs.shape == (7, 3, 4) and rollout.obs.dtype == np.float32
    assert rollout.action.shape == (7, 3) and rollout.action.dtype == np.int64
    for name in ("logprob", "value", "reward", "next_value"):
        assert getattr(rollout, name).shape == (7, 3) and getattr(rollout, name).dtype == np.float32, name
    assert rollout.terminated.dtype == rollout.truncated.dtype == np.bool_
    assert rollout.policy_version == 0 and episodes["env_steps"] == 21
    assert (rollout.logprob < 0).all() and (rollout.reward == 1.0).all()
    last_obs = runner.obs.copy()
    second, episodes = runner.collect(steps=5)
    assert second.obs.shape == (5, 3, 4) and episodes["env_steps"] == 36
    np.testing.assert_array_equal(second.obs[0], last_obs)  # the next rollout goes on where this one stopped
    # CartPole episodes under a near-uniform policy end after ~20 steps: returns come back with the rollout.
    _, episodes = runner.collect(steps=60)
    assert episodes["returns"] and all(r == length for r, length in zip(episodes["returns"], episodes["lengths"]))


def test_truncation_bootstraps_from_the_final_obs_not_the_reset_obs():
    """Pendulum never terminates; with 5-step episodes steps 4 and 9 are truncations. There next_value must be
    V(final obs) of the acting weights (replayed here in a second env), elsewhere V of the next recorded obs."""
    cfg = ppo_cfg("pendulum", "env.num_envs=2", "+env.kwargs.max_episode_steps=5")
    runner = runner_for(cfg, seed=3, steps=12)
    rollout, episodes = runner.collect()
    assert not rollout.terminated.any()
    np.testing.assert_array_equal(np.flatnonzero(rollout.truncated.all(axis=1)), [4, 9])
    assert len(episodes["returns"]) == 4 and episodes["lengths"] == [5, 5, 5, 5]

    replay = VectorEnv("Pendulum-v1", 2, 3, kwargs={"max_episode_steps": 5})
    replay.reset()
    value = lambda obs: runner.policy.value(torch.as_tensor(obs)).detach().numpy()  # noqa: E731
    for t in range(12):
        step = replay.step(runner.policy.to_env(torch.as_tensor(rollout.action[t])).numpy())
        np.testing.assert_allclose(rollout.obs[t + 1] if t < 11 else runner.obs, step.obs)  # same trajectory
        expected = value(step.next_obs) if t in (4, 9) else (rollout.value[t + 1] if t < 11 else value(runner.obs))
        np.testing.assert_allclose(rollout.next_value[t], expected, rtol=1e-5, atol=1e-6)
    # the reset obs after a truncation has another value than the final obs: the bootstrap really differs
    assert not np.allclose(rollout.next_value[4], rollout.value[5])
    assert np.all(np.abs(rollout.action) > 0) and rollout.action.shape == (12, 2, 1)


def test_learner_update_lowers_the_loss_and_its_weights_reach_the_runner(ray_cpu, tmp_path):
    ray = ray_cpu
    cfg = ppo_cfg("cartpole", "env.num_envs=4", "algo.rollout_steps=32", "algo.epochs=4", "algo.minibatches=2")
    algo, actor = OmegaConf.to_container(cfg.algo), OmegaConf.to_container(cfg.model.actor)
    runner = ray.remote(concurrency_groups=WATCH)(RolloutRunner).remote(0, OmegaConf.to_container(cfg.env), actor, 0,
                                                                         32, 1)
    spaces = ray.get(runner.spaces.remote())
    learner = ray.remote(concurrency_groups=WATCH)(PPOLearner).remote(algo, actor, spaces, 0, 1)
    local = runner_for(cfg).policy  # a plain copy of the network, to look at published weights

    def published(weights) -> dict:
        box, _ = ray.get(weights)
        return ray.get(box[0])

    weights = learner.publish.remote()
    assert ray.get(runner.receive_weights.remote(weights)) == 1
    rollout_ref, episodes = runner.collect.options(num_returns=2).remote()
    rollout = ray.get(rollout_ref)
    assert rollout.policy_version == 1 and ray.get(episodes)["env_steps"] == 128
    local.load_state_dict(published(weights))  # the runner acted with exactly the learner's weights
    np.testing.assert_allclose(rollout.value, local.value(torch.tensor(rollout.obs)).detach().numpy(), rtol=1e-6)

    batch = flatten_for_update(rollout, PPOConfig.from_mapping(algo))
    before = ppo_loss(local, batch, PPOConfig.from_mapping(algo))[0].item()
    metrics = ray.get(learner.update.remote(0.0, rollout_ref))
    assert metrics["staleness"] == 0 and metrics["updates"] == 1 and metrics["gradient_steps"] == 8
    assert metrics["lr"] == pytest.approx(float(cfg.algo.lr))
    weights = learner.publish.remote()
    assert ray.get(weights)[1] == 2
    local.load_state_dict(published(weights))
    assert ppo_loss(local, batch, PPOConfig.from_mapping(algo))[0].item() < before

    assert ray.get(runner.receive_weights.remote(weights)) == 2
    second, _ = runner.collect.options(num_returns=2).remote()
    assert ray.get(second).policy_version == 2  # the runner picked up the new version
    assert ray.get(learner.update.remote(0.5, second))["lr"] == pytest.approx(float(cfg.algo.lr) / 2)  # annealed

    saved = published(learner.publish.remote())
    path = ray.get(learner.save.remote(str(tmp_path / "final.pt"), {"env_steps": 256}))
    state = torch.load(path, map_location="cpu", weights_only=True)  # no pickled code in a checkpoint
    assert state["updates"] == 2 and state["extra"] == {"env_steps": 256} and "optimizer" in state["agent"]
    ray.get(learner.update.remote(0.5, second))  # move on, then come back to the checkpoint
    assert ray.get(learner.load.remote(path)) == {"env_steps": 256}
    for key, value in published(learner.publish.remote()).items():
        torch.testing.assert_close(value, saved[key])

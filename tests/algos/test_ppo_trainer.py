"""PPO's learner stages on a fixed rollout, without Ray: GAE wiring, flattening, and that the update
lowers the PPO objective it optimizes."""
import numpy as np
import pytest
import torch

from rlfarm.algos.ppo import gae
from rlfarm.algos.ppo_trainer import PPOConfig, flatten_for_update, ppo_loss, ppo_update
from rlfarm.buffers.rollout import EnvRollout
from rlfarm.models.actor_critic import ActorCritic


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny MLPs: threads only add overhead


def fixed_rollout(model: ActorCritic, steps: int = 16, envs: int = 4, seed: int = 0) -> EnvRollout:
    """A rollout as a runner would record it from `model`, on made-up states with made-up rewards."""
    rng = np.random.default_rng(seed)
    obs = torch.as_tensor(rng.normal(size=(steps, envs, 4)), dtype=torch.float32)
    action, logprob, value = model.sample(obs.reshape(-1, 4))
    next_value = torch.cat([value.view(steps, envs)[1:], torch.zeros(1, envs)])
    return EnvRollout(obs=obs.numpy(), action=action.view(steps, envs).numpy(),
                      logprob=logprob.view(steps, envs).numpy(), value=value.view(steps, envs).numpy(),
                      reward=rng.normal(size=(steps, envs)).astype(np.float32),
                      terminated=rng.random((steps, envs)) < 0.05, truncated=rng.random((steps, envs)) < 0.05,
                      next_value=next_value.numpy(), policy_version=3)


def test_flatten_adds_gae_of_the_rollout_and_keeps_rows_aligned():
    torch.manual_seed(0)
    rollout = fixed_rollout(ActorCritic(4, 2))
    cfg = PPOConfig(gamma=0.9, gae_lambda=0.7)
    batch = flatten_for_update(rollout, cfg)
    tensors = rollout.tensors()
    advantages, returns = gae(tensors["reward"], tensors["value"], tensors["next_value"], tensors["terminated"],
                              tensors["truncated"], 0.9, 0.7)
    assert batch["obs"].shape == (64, 4) and batch["action"].shape == (64,)
    torch.testing.assert_close(batch["advantage"], advantages.reshape(-1))
    torch.testing.assert_close(batch["return"], returns.reshape(-1))
    # row k of the flat batch is step k // N of env k % N
    torch.testing.assert_close(batch["obs"][4 * 5 + 2], tensors["obs"][5, 2])


@pytest.mark.parametrize("epochs, minibatches", [(4, 4), (10, 1)])
def test_update_lowers_the_ppo_loss_on_a_fixed_rollout(epochs, minibatches):
    torch.manual_seed(0)
    model = ActorCritic(4, 2, hidden=(32, 32))
    batch = flatten_for_update(fixed_rollout(model), PPOConfig())
    cfg = PPOConfig(lr=3e-3, epochs=epochs, minibatches=minibatches)
    before, _ = ppo_loss(model, batch, cfg)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    metrics = ppo_update(model, optimizer, batch, cfg, torch.Generator().manual_seed(0))
    after, parts = ppo_loss(model, batch, cfg)
    assert metrics["gradient_steps"] == epochs * minibatches
    assert after.item() < before.item() - 0.05, (before.item(), after.item())
    assert parts["approx_kl"].item() > 0  # the policy moved ...
    assert parts["clip_fraction"].item() < 1.0  # ... and the clip did not freeze every sample


def test_update_with_more_minibatches_than_samples_steps_on_each_sample():
    torch.manual_seed(0)
    model = ActorCritic(4, 2, hidden=(8,))
    batch = flatten_for_update(fixed_rollout(model, steps=1, envs=3), PPOConfig())
    cfg = PPOConfig(epochs=2, minibatches=8)
    metrics = ppo_update(model, torch.optim.Adam(model.parameters()), batch, cfg)
    assert metrics["gradient_steps"] == 2 * 3 and np.isfinite(metrics["policy_loss"])


def test_target_kl_stops_the_epochs_early():
    torch.manual_seed(0)
    model = ActorCritic(4, 2, hidden=(32, 32))
    batch = flatten_for_update(fixed_rollout(model), PPOConfig())
    cfg = PPOConfig(lr=1e-2, epochs=50, minibatches=1, target_kl=1e-3)
    metrics = ppo_update(model, torch.optim.Adam(model.parameters(), lr=cfg.lr), batch, cfg)
    assert 1 <= metrics["gradient_steps"] < 50


def test_rollouts_of_different_versions_are_not_joined():
    torch.manual_seed(0)
    model = ActorCritic(4, 2)
    a, b = fixed_rollout(model), fixed_rollout(model, seed=1)
    joined = EnvRollout.concat([a, b])
    assert joined.obs.shape == (16, 8, 4) and joined.transitions == 128
    np.testing.assert_array_equal(joined.reward[:, 4:], b.reward)
    b.policy_version = 2
    with pytest.raises(ValueError, match="same length and policy version"):
        EnvRollout.concat([a, b])

"""The PPO actor-critic: one class, a categorical head for Discrete actions and a Gaussian for boxes."""
import numpy as np
import torch
from torch.distributions import Categorical, Normal

from rlfarm.models.actor_critic import ActorCritic


def test_discrete_head_samples_scores_and_acts_greedily():
    torch.manual_seed(0)
    model = ActorCritic(4, 3, hidden=(16, 16))
    obs = torch.randn(5, 4)
    action, logprob, value = model.sample(obs)
    assert action.shape == (5,) and action.dtype == torch.int64 and logprob.shape == value.shape == (5,)
    scored, entropy, value_again = model.evaluate(obs, action)
    torch.testing.assert_close(scored, logprob)
    torch.testing.assert_close(value_again, value)
    logits = model.actor(obs)
    torch.testing.assert_close(entropy, Categorical(logits=logits).entropy())
    assert torch.equal(model.act(obs, deterministic=True), logits.argmax(-1))
    assert torch.equal(model.to_env(action), action)


def test_gaussian_head_scores_the_raw_sample_and_clips_what_the_env_gets():
    torch.manual_seed(0)
    low, high = np.array([-2.0, -1.0], dtype=np.float32), np.array([2.0, 1.0], dtype=np.float32)
    model = ActorCritic(3, 2, low, high, hidden=(16,), init_log_std=1.0)  # σ = e: many samples fall outside
    obs = torch.randn(256, 3)
    action, logprob, _ = model.sample(obs)
    assert action.shape == (256, 2) and (action.abs() > torch.tensor(high)).any()
    mean = model.actor(obs)
    expected = Normal(mean, torch.full_like(mean, np.e)).log_prob(action).sum(-1)
    torch.testing.assert_close(logprob, expected)  # log π of the unclipped sample, summed over dimensions
    clipped = model.to_env(action)
    assert (clipped >= torch.tensor(low)).all() and (clipped <= torch.tensor(high)).all()
    torch.testing.assert_close(model.act(obs, deterministic=True), model.to_env(mean))


def test_first_policy_is_near_uniform():
    """The policy head starts at gain 0.01: every action about equally likely, so exploration starts wide."""
    torch.manual_seed(0)
    probs = ActorCritic(4, 2).distribution(torch.randn(64, 4)).probs
    assert (probs - 0.5).abs().max() < 0.02

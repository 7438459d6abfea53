"""PPO math against values worked out by hand (the arithmetic is in the comments)."""
import math

import pytest
import torch

from rlfarm.algos.ppo import (approx_kl, clip_fraction, clipped_surrogate, entropy_from_logits, gae, masked_mean,
                              policy_loss, value_loss)


def test_masked_mean_and_shared_count():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[1, 0], [1, 1]])
    assert masked_mean(x, mask).item() == pytest.approx(8 / 3)  # (1 + 3 + 4) / 3
    assert masked_mean(x, mask, count=4).item() == pytest.approx(2.0)  # 8 / 4
    assert masked_mean(x).item() == pytest.approx(2.5)


def test_gae_truncation_bootstraps_termination_does_not_and_neither_crosses_episodes():
    gamma, lam = 0.9, 0.5
    # env 0: truncated at t=1 (next_values[1] = V(final obs) = 0.5 is bootstrapped)
    # env 1: terminated at t=1 (next_values[1] = 9.0 must be ignored)
    rewards = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 1.0]])
    values = torch.tensor([[0.5, 0.2], [1.0, 0.4], [1.5, 0.6]])
    next_values = torch.tensor([[1.0, 0.4], [0.5, 9.0], [3.0, 0.8]])
    terminated = torch.tensor([[0, 0], [0, 1], [0, 0]])
    truncated = torch.tensor([[0, 0], [1, 0], [0, 0]])
    advantages, returns = gae(rewards, values, next_values, terminated, truncated, gamma, lam)
    # env 0: δ2 = 2 + .9·3 − 1.5 = 3.2 → A2 = 3.2
    #        δ1 = 0 + .9·.5 − 1 = −.55, done → A1 = −.55
    #        δ0 = 1 + .9·1 − .5 = 1.4 → A0 = 1.4 + .45·(−.55) = 1.1525
    # env 1: δ2 = 1 + .9·.8 − .6 = 1.12 → A2 = 1.12
    #        δ1 = 1 + 0 − .4 = .6 (terminated: no bootstrap), done → A1 = .6
    #        δ0 = 0 + .9·.4 − .2 = .16 → A0 = .16 + .45·.6 = .43
    expected = torch.tensor([[1.1525, 0.43], [-0.55, 0.6], [3.2, 1.12]])
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, expected + values)


def test_gae_with_lambda_one_is_the_discounted_return_minus_value():
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    values = torch.tensor([[0.5], [0.5], [0.5]])
    next_values = torch.tensor([[0.5], [0.5], [4.0]])
    zeros = torch.zeros(3, 1)
    advantages, returns = gae(rewards, values, next_values, zeros, zeros, gamma=0.5, lam=1.0)
    # G0 = 1 + .5·2 + .25·3 + .125·4 = 3.25; G1 = 2 + .5·3 + .25·4 = 4.5; G2 = 3 + .5·4 = 5
    torch.testing.assert_close(returns, torch.tensor([[3.25], [4.5], [5.0]]))
    torch.testing.assert_close(advantages, returns - values)


def test_clipped_surrogate_hand_values():
    ratio = torch.tensor([1.5, 1.5, 0.5, 0.5, 1.0, 1.25])
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0, 2.0, 1.0])
    old = torch.zeros(6)
    loss = clipped_surrogate(ratio.log(), old, advantages, clip_low=0.2, clip_high=0.28)
    # −min(ρA, clip(ρ, .8, 1.28)A):
    #   ρ=1.5,A=1 → −min(1.5, 1.28) = −1.28     ρ=1.5,A=−1 → −min(−1.5, −1.28) = 1.5
    #   ρ=.5,A=1 → −min(.5, .8) = −.5           ρ=.5,A=−1 → −min(−.5, −.8) = .8
    #   ρ=1,A=2 → −2                            ρ=1.25,A=1 → −1.25 (inside 1 + ε_high = 1.28)
    torch.testing.assert_close(loss, torch.tensor([-1.28, 1.5, -0.5, 0.8, -2.0, -1.25]))
    # symmetric ε = .2 clips the last one at 1.2
    assert clipped_surrogate(ratio.log(), old, advantages, 0.2, 0.2)[-1].item() == pytest.approx(-1.2)


def test_clipped_tokens_have_no_gradient():
    logprobs = torch.log(torch.tensor([1.5, 1.1])).requires_grad_()
    loss = clipped_surrogate(logprobs, torch.zeros(2), torch.tensor([1.0, 1.0]), 0.2, 0.2).sum()
    loss.backward()
    # d(−ρA)/d log π = −ρA: 0 where clipped (1.5 > 1.2), −1.1 where not
    torch.testing.assert_close(logprobs.grad, torch.tensor([0.0, -1.1]))


def test_policy_loss_masks_padding():
    logprobs = torch.zeros(2, 2)
    advantages = torch.tensor([[1.0, 5.0], [3.0, 7.0]])
    mask = torch.tensor([[1, 0], [1, 0]])
    assert policy_loss(logprobs, logprobs, advantages, mask).item() == pytest.approx(-2.0)  # −(1 + 3) / 2


def test_value_loss_plain_and_clipped():
    values, old_values, returns = torch.tensor([1.0, 2.0]), torch.tensor([0.0, 2.0]), torch.tensor([2.0, 3.0])
    # plain: ½·((1 − 2)² + (2 − 3)²)/2 = .5
    assert value_loss(values, old_values, returns).item() == pytest.approx(0.5)
    # clipped: V_clip = (0 + clip(1, ±.2), 2) = (.2, 2); max((1)², (1.8)²) = 3.24, max(1, 1) = 1; ½·(4.24/2) = 1.06
    assert value_loss(values, old_values, returns, clip_eps=0.2).item() == pytest.approx(1.06)


def test_entropy_from_logits():
    logits = torch.tensor([[0.0, 0.0], [0.0, math.log(3.0)]])
    # uniform over 2: ln 2; p = (.25, .75): −(.25 ln .25 + .75 ln .75) = .562335
    torch.testing.assert_close(entropy_from_logits(logits), torch.tensor([math.log(2.0), 0.562335]),
                               atol=1e-6, rtol=0)


def test_clip_fraction_and_approx_kl():
    ratio = torch.tensor([1.5, 1.5, 0.5, 1.0])
    advantages = torch.tensor([1.0, -1.0, -1.0, 1.0])
    # clipped where the ratio left the range on the side A pushes: (1.5, A>0) and (.5, A<0) → 2 of 4
    assert clip_fraction(ratio.log(), torch.zeros(4), advantages).item() == pytest.approx(0.5)
    # k3 at ρ = 2: (2 − 1) − ln 2 = .306853
    assert approx_kl(torch.tensor([math.log(2.0)]), torch.zeros(1)).item() == pytest.approx(1 - math.log(2.0))

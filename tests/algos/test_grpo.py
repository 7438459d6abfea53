"""GRPO / DAPO math against values worked out by hand (the arithmetic is in the comments)."""
import math

import pytest
import torch

from rlfarm.algos.grpo import grpo_advantages, grpo_loss, keep_groups, kl_k3, rloo_advantages


def test_grpo_advantages_normalize_within_each_group():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 3.0]])
    advantages = grpo_advantages(rewards, eps=0.0)
    # group 0: mean .5, unbiased std = sqrt(4·.25/3) = .57735 → ±.5/.57735 = ±.866025
    # group 1: mean .75, std = sqrt((3·.5625 + 5.0625)/3) = 1.5 → −.75/1.5 = −.5, 2.25/1.5 = 1.5
    s = 0.5 / math.sqrt(1 / 3)
    torch.testing.assert_close(advantages, torch.tensor([[s, -s, -s, s], [-0.5, -0.5, -0.5, 1.5]]))


def test_grpo_advantages_flat_input_and_dr_grpo():
    flat = torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0])
    advantages = grpo_advantages(flat, group_size=3, norm_std=False)
    assert advantages.shape == (6,)
    torch.testing.assert_close(advantages, torch.tensor([-1.0, 0.0, 1.0, 0.0, 0.0, 0.0]))
    # a group with equal rewards gets 0, not 0/0
    assert grpo_advantages(flat, group_size=3)[3:].abs().max().item() == 0.0


def test_grpo_advantages_reject_bad_groups():
    with pytest.raises(ValueError, match="groups of 4"):
        grpo_advantages(torch.zeros(6), group_size=4)
    with pytest.raises(ValueError, match="G >= 2"):
        grpo_advantages(torch.zeros(3, 1))


def test_rloo_baseline_is_the_mean_of_the_others():
    # r = (1, 0, 0, 1): A_0 = 1 − (0 + 0 + 1)/3 = 2/3, A_1 = 0 − (1 + 0 + 1)/3 = −2/3
    torch.testing.assert_close(rloo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]])),
                               torch.tensor([[2 / 3, -2 / 3, -2 / 3, 2 / 3]]))


def test_kl_k3():
    logprobs, ref = torch.tensor([math.log(0.5), -1.0]), torch.tensor([math.log(0.25), -1.0])
    # π_ref/π = .5: .5 − ln .5 − 1 = .193147; equal policies: 0
    torch.testing.assert_close(kl_k3(logprobs, ref), torch.tensor([0.5 + math.log(2.0) - 1.0, 0.0]))


def test_grpo_loss_is_a_mean_over_tokens_not_sequences():
    # sample 0: 3 tokens, Â = +1; sample 1: 1 token, Â = −1; ρ = 1 everywhere so L_t = −Â
    logprobs = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    advantages = torch.tensor([1.0, -1.0])
    # token mean: (−1·3 + 1·1)/4 = −.5   (a per-sequence mean would give (−1 + 1)/2 = 0)
    assert grpo_loss(logprobs, logprobs, advantages, mask).item() == pytest.approx(-0.5)
    # one micro-batch of a batch with 8 tokens in all: −2/8
    assert grpo_loss(logprobs, logprobs, advantages, mask, num_tokens=8).item() == pytest.approx(-0.25)


def test_grpo_loss_clip_higher():
    old = torch.zeros(1, 2)
    logprobs = torch.log(torch.tensor([[1.25, 0.7]]))
    advantages = torch.tensor([[1.0, -1.0]])
    mask = torch.ones(1, 2)
    # ρ=1.25, A=1 inside [.8, 1.28] → −1.25;  ρ=.7, A=−1 → −min(−.7, −.8) = .8;  mean = −.225
    assert grpo_loss(logprobs, old, advantages, mask, 0.2, 0.28).item() == pytest.approx(-0.225)
    # symmetric clip at 1.2: (−1.2 + .8)/2 = −.2
    assert grpo_loss(logprobs, old, advantages, mask, 0.2, 0.2).item() == pytest.approx(-0.2)


def test_grpo_loss_kl_term():
    logprobs = torch.full((1, 2), math.log(0.5))
    ref = torch.full((1, 2), math.log(0.25))
    mask = torch.ones(1, 2)
    # Â = 0 so only β·k3 = .1·.193147 remains
    loss = grpo_loss(logprobs, logprobs, torch.zeros(1), mask, ref_logprobs=ref, kl_coef=0.1)
    assert loss.item() == pytest.approx(0.1 * (0.5 + math.log(2.0) - 1.0))
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo_loss(logprobs, logprobs, torch.zeros(1), mask, kl_coef=0.1)


def test_keep_groups_drops_groups_without_signal():
    rewards = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 1.0, 1.0], [0.5, 0.5, 0.5], [0.0, 0.5, 0.0]])
    # all wrong, all right, mixed (acc 2/3), all alike (no signal), mixed (acc 1/6)
    assert keep_groups(rewards).tolist() == [False, False, True, False, True]
    assert keep_groups(rewards, low=0.0, high=0.5).tolist() == [False, False, False, False, True]

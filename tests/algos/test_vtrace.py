"""V-trace against values worked out by hand, episode ends inside a chunk, and the on-policy case where its targets
are the n-step bootstrapped returns (GAE with λ = 1)."""
import math

import pytest
import torch

from rlfarm.algos.ppo import gae
from rlfarm.algos.vtrace import appo_loss, impala_loss, vtrace

GAMMA = 0.9


def column(*xs):
    return torch.tensor(xs, dtype=torch.float64).unsqueeze(1)  # [T, 1]


def test_off_policy_targets_by_hand():
    """Two steps, no episode end. Ratios π/μ = 2 (ρ̄ = c̄ = 1 truncate it to 1) and 0.5."""
    rewards, values, next_values = column(1.0, 2.0), column(0.5, 1.0), column(1.0, 3.0)
    behaviour = column(math.log(0.25), math.log(0.8))
    target = column(math.log(0.5), math.log(0.4))
    zeros = torch.zeros(2, 1)
    trace = vtrace(behaviour, target, rewards, values, next_values, zeros, zeros, GAMMA)
    # ρ = (1, 0.5), c = (1, 0.5); δ_1 = 0.5 (2 + 0.9·3 − 1) = 1.85; δ_0 = 1 (1 + 0.9·1 − 0.5) = 1.4
    # v_1 = 1 + 1.85 = 2.85; v_0 = 0.5 + 1.4 + 0.9·1·(2.85 − 1) = 3.565
    torch.testing.assert_close(trace.values, column(3.565, 2.85))
    # A_0 = 1 (1 + 0.9·v_1 − 0.5) = 3.065; A_1 = 0.5 (2 + 0.9·3 − 1) = 1.85 (past the chunk: V(x_2) = 3)
    torch.testing.assert_close(trace.advantages, column(3.065, 1.85))
    torch.testing.assert_close(trace.clipped_rho, column(1.0, 0.5))


def test_episode_ends_inside_a_chunk():
    """Step 0 terminates (no bootstrap, no trace into step 1); step 1 is truncated (bootstrap on its final
    observation's value, still no trace past it); on-policy so every ratio is 1."""
    rewards, values, next_values = column(1.0, 2.0, 3.0), column(0.5, 1.0, 2.0), column(9.0, 4.0, 5.0)
    same = torch.zeros(3, 1)
    terminated, truncated = column(1.0, 0.0, 0.0), column(0.0, 1.0, 0.0)
    trace = vtrace(same, same, rewards, values, next_values, terminated, truncated, GAMMA)
    # v_0 = r_0 = 1 (terminated: 9.0 is never used); v_1 = 2 + 0.9·4 = 5.6; v_2 = 3 + 0.9·5 = 7.5
    torch.testing.assert_close(trace.values, column(1.0, 5.6, 7.5))
    torch.testing.assert_close(trace.advantages, column(0.5, 4.6, 5.5))


@pytest.mark.parametrize("seed", [0, 1])
def test_on_policy_targets_are_the_bootstrapped_returns(seed):
    generator = torch.Generator().manual_seed(seed)
    steps, envs = 7, 3
    rewards, values, next_values = (torch.randn(steps, envs, generator=generator, dtype=torch.float64) for _ in range(3))
    done = torch.rand(steps, envs, generator=generator) < 0.25
    terminated = done & (torch.rand(steps, envs, generator=generator) < 0.5)
    truncated = done & ~terminated
    # within an episode the next observation is the next step's: V(x_{t+1}) is the next row of values
    next_values = torch.where(done[:-1], next_values[:-1], values[1:])
    next_values = torch.cat([next_values, torch.randn(1, envs, generator=generator, dtype=torch.float64)])
    logprobs = torch.randn(steps, envs, generator=generator, dtype=torch.float64)
    trace = vtrace(logprobs, logprobs, rewards, values, next_values, terminated, truncated, GAMMA,
                   rho_bar=2.0, c_bar=1.5)
    advantages, returns = gae(rewards, values, next_values, terminated, truncated, GAMMA, lam=1.0)
    torch.testing.assert_close(trace.values, returns)
    torch.testing.assert_close(trace.advantages, advantages)  # A_t = r + γ v_{t+1} − V = the GAE(1) advantage


def test_losses_push_up_the_likely_good_action_and_fit_the_targets():
    trace = vtrace(column(0.0, 0.0), column(0.0, 0.0), column(1.0, -1.0), column(0.0, 0.0), column(0.0, 0.0),
                   torch.zeros(2, 1), torch.zeros(2, 1), GAMMA)
    logprobs = torch.zeros(2, 1, dtype=torch.float64, requires_grad=True)
    values = torch.zeros(2, 1, dtype=torch.float64, requires_grad=True)
    entropy = torch.ones(2, 1, dtype=torch.float64)
    for loss, stats in (impala_loss(logprobs, entropy, values, trace),
                        appo_loss(logprobs, torch.zeros(2, 1, dtype=torch.float64), entropy, values, trace)):
        logprobs.grad = values.grad = None
        loss.backward()
        assert logprobs.grad[0, 0] < 0 < logprobs.grad[1, 0]  # descending raises the good action's logprob
        assert values.grad[0, 0] < 0 < values.grad[1, 0]      # and moves V toward its targets
        assert stats["entropy"] == 1.0


def test_appo_clips_a_ratio_that_left_the_trust_region():
    trace = vtrace(column(0.0), column(0.0), column(1.0), column(0.0), column(0.0), torch.zeros(1, 1),
                   torch.zeros(1, 1), GAMMA)
    far = torch.full((1, 1), 0.5, dtype=torch.float64, requires_grad=True)  # ratio e^0.5 ≈ 1.65 > 1 + clip
    loss, stats = appo_loss(far, torch.zeros(1, 1, dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64),
                            torch.zeros(1, 1, dtype=torch.float64), trace, clip=0.1)
    loss.backward()
    assert far.grad.abs().item() == 0.0 and stats["clip_fraction"] == 1.0  # clipped: no push further


def test_appo_anchored_to_a_target_clips_around_the_target_not_the_runner():
    """With a target network the clip is on π/π_target and the advantage keeps ρ = min(ρ̄, π_target/μ) (it takes the
    runner's action to π_target's). Here π = π_target = μ/2 and the action was bad: against μ the ratio 0.5 is far
    outside the trust region (clipped: no gradient); against the target it is 1, so π still learns to avoid it."""
    behaviour, target = column(0.0), column(math.log(0.5))
    trace = vtrace(behaviour, target, column(-1.0), column(0.0), column(0.0), torch.zeros(1, 1), torch.zeros(1, 1), GAMMA)
    assert trace.clipped_rho.item() == pytest.approx(0.5) and trace.advantages.item() == pytest.approx(-0.5)
    logprobs = target.clone().requires_grad_(True)
    zeros = torch.zeros(1, 1, dtype=torch.float64)
    anchored, stats = appo_loss(logprobs, target, zeros, zeros, trace, anchored_to_target=True)
    (grad_anchored,) = torch.autograd.grad(anchored, logprobs)
    on_mu, stats_mu = appo_loss(logprobs, behaviour, zeros, zeros, trace)
    (grad_mu,) = torch.autograd.grad(on_mu, logprobs)
    assert grad_anchored.item() == pytest.approx(0.5) and stats["clip_fraction"] == 0.0  # −ρA · ratio = 0.5 · 1
    assert grad_mu.item() == 0.0 and stats_mu["clip_fraction"] == 1.0


def test_discounted_sums_equal_the_backward_loop_across_episode_ends():
    """The vectorized recursion y_t = x_t + f_t y_{t+1} against the plain loop, zero factors (episode ends) included."""
    from rlfarm.algos.vtrace import discounted_sums

    generator = torch.Generator().manual_seed(3)
    x = torch.randn(32, 5, generator=generator, dtype=torch.float64)
    factors = torch.rand(32, 5, generator=generator, dtype=torch.float64)
    factors[7, 1] = factors[20] = 0.0
    expected, carried = torch.zeros_like(x), torch.zeros(5, dtype=torch.float64)
    for t in reversed(range(32)):
        carried = x[t] + factors[t] * carried
        expected[t] = carried
    torch.testing.assert_close(discounted_sums(x, factors), expected)
    assert torch.equal(discounted_sums(x, factors)[20], x[20])  # a zero factor cuts the sum after its step

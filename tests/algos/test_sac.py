"""SAC loss math against hand-computed values, and the agent's update mechanics."""
import functools
import math

import pytest
import torch

from rlfarm.algos.sac import SACAgent, actor_loss, critic_loss, soft_q_target, temperature_loss
from rlfarm.models.mlp import EnsembleQ, SquashedGaussianActor


def test_soft_q_target_by_hand():
    y = soft_q_target(reward=torch.tensor([1.0, 2.0]), terminated=torch.tensor([0.0, 1.0]),
                      next_q=torch.tensor([[3.0, 5.0], [4.0, 1.0]]), next_logp=torch.tensor([0.5, 0.2]),
                      alpha=0.1, gamma=0.9)
    # min_i Q = [3, 1]; soft value = [3 - 0.05, 1 - 0.02]; terminated transition does not bootstrap.
    assert torch.allclose(y, torch.tensor([1 + 0.9 * 2.95, 2.0]))


def test_critic_loss_by_hand():
    loss = critic_loss(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([1.0, 1.0]))
    assert loss.item() == pytest.approx((0 + 1) / 2 + (4 + 9) / 2)


def test_actor_loss_by_hand():
    loss = actor_loss(torch.tensor([[1.0, 4.0], [2.0, 3.0]]), torch.tensor([0.5, -0.5]), alpha=0.2)
    assert loss.item() == pytest.approx(((0.1 - 1) + (-0.1 - 3)) / 2)


def test_temperature_loss_by_hand():
    log_alpha = torch.tensor(math.log(0.5), requires_grad=True)
    loss = temperature_loss(log_alpha, torch.tensor([1.0, 2.0]), target_entropy=-1.0)
    assert loss.item() == pytest.approx(-(0.5 * 0 + 0.5 * 1) / 2)
    loss.backward()  # dJ/dlogα = −α (logp + H̄) averaged
    assert log_alpha.grad.item() == pytest.approx(-0.25)


def test_squashed_gaussian_logprob_matches_torch_distributions():
    torch.manual_seed(0)
    actor = SquashedGaussianActor(3, 2, [-2.0, -1.0], [2.0, 3.0], hidden=(16, 16))
    obs = torch.randn(64, 3)
    torch.manual_seed(1)
    action, logp = actor.sample(obs)
    mean, log_std = actor._dist_params(obs)
    base = torch.distributions.Normal(mean, log_std.exp())
    dist = torch.distributions.TransformedDistribution(base, [
        torch.distributions.TanhTransform(cache_size=1),
        torch.distributions.AffineTransform(actor.action_bias, actor.action_scale)])
    expected = dist.log_prob(action.clamp(-1.999, 2.999)).sum(-1)
    inside = (action[:, 0].abs() < 1.99) & (action[:, 1] > -0.99) & (action[:, 1] < 2.99)
    assert torch.allclose(logp[inside], expected[inside], atol=2e-3)
    assert (action[:, 0].abs() <= 2).all() and (action[:, 1] >= -1).all() and (action[:, 1] <= 3).all()


def test_ensemble_q_members_are_independent():
    q = EnsembleQ(3, 1, hidden=(8,), ensemble=2)
    obs, act = torch.randn(5, 3), torch.randn(5, 1)
    out = q(obs, act)
    assert out.shape == (2, 5)
    with torch.no_grad():
        q.layers[0].weight[1].zero_()
    out2 = q(obs, act)
    assert torch.equal(out[0], out2[0]) and not torch.equal(out[1], out2[1])


def make_agent(**kw):
    return SACAgent(3, 1, [-2.0], [2.0], actor=functools.partial(SquashedGaussianActor, hidden=(32, 32)),
                    critic=functools.partial(EnsembleQ, hidden=(32, 32)), **kw)


def batch(n=32):
    g = torch.Generator().manual_seed(0)
    return {"obs": torch.randn(n, 3, generator=g), "action": torch.rand(n, 1, generator=g) * 4 - 2,
            "reward": torch.randn(n, generator=g), "next_obs": torch.randn(n, 3, generator=g),
            "terminated": torch.zeros(n)}


def test_update_moves_target_by_polyak_and_tunes_alpha():
    torch.manual_seed(0)
    agent = make_agent(tau=0.1)
    target_before = [p.clone() for p in agent.critic_target.parameters()]
    metrics = agent.update(batch())
    for before, target, online in zip(target_before, agent.critic_target.parameters(), agent.critic.parameters()):
        assert torch.allclose(target, 0.9 * before + 0.1 * online, atol=1e-6)
    assert set(metrics) >= {"critic_loss", "actor_loss", "alpha", "entropy"}
    assert agent.alpha.item() != 1.0  # autotune took a step
    assert agent.updates == 1


def test_actor_update_leaves_critic_untouched():
    torch.manual_seed(0)
    agent = make_agent()
    critic_before = [p.clone() for p in agent.critic.parameters()]
    agent._update_actor(batch()["obs"])
    assert all(torch.equal(a, b) for a, b in zip(critic_before, agent.critic.parameters()))
    assert all(p.requires_grad for p in agent.critic.parameters())


def test_state_dict_round_trip_continues_identically():
    torch.manual_seed(0)
    a = make_agent()
    for _ in range(3):
        a.update(batch())
    b = make_agent()
    b.load_state_dict(a.state_dict())
    torch.manual_seed(5)
    ma = a.update(batch())
    torch.manual_seed(5)
    mb = b.update(batch())
    assert ma["critic_loss"].item() == pytest.approx(mb["critic_loss"].item(), rel=1e-6)


def test_one_backward_for_actor_and_temperature_equals_two_separate_ones():
    torch.manual_seed(0)
    merged, separate = make_agent(), make_agent()
    separate.load_state_dict(merged.state_dict())
    obs = batch()["obs"]
    torch.manual_seed(3)
    merged._update_actor(obs)
    # The textbook order: the actor's loss and step, then the temperature's own loss, backward and step.
    torch.manual_seed(3)
    action, logp = separate.actor.sample(obs)
    separate.critic.requires_grad_(False)
    separate.actor_optim.zero_grad()
    actor_loss(separate.critic(obs, action), logp, separate.alpha).backward()
    separate.actor_optim.step()
    separate.critic.requires_grad_(True)
    separate.alpha_optim.zero_grad()
    temperature_loss(separate.log_alpha, logp, separate.target_entropy).backward()
    separate.alpha_optim.step()
    assert torch.equal(merged.log_alpha, separate.log_alpha)
    assert all(torch.equal(a, b) for a, b in zip(merged.actor.parameters(), separate.actor.parameters()))

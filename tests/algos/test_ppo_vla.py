"""PPO with a critic for VLAs (rlfarm/algos/ppo_vla.py): rewards per policy call, GAE over action chunks, and the
update's effect on the tiny VLA's value head and action tokens."""
import numpy as np
import pytest
import torch

from rlfarm.algos.ppo_vla import PPOVLAConfig, chunk_advantages, chunk_rewards, explained_variance, update_ppo_vla
from rlfarm.models.vla import TinyVLA


def test_the_success_is_paid_on_the_episodes_last_call_and_every_episode_ends_there():
    batch = {"called": np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], bool),
             "success": np.array([1.0, 0.0, 1.0], np.float32)}
    rewards, last = chunk_rewards(batch)
    assert rewards.tolist() == [[0, 0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 1]]
    assert last.tolist() == [[0, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 1]]


def test_gae_over_chunks_by_hand():
    """γ = 0.9, λ = 0.5, values 0.2 / 0.4 / 0.6 on a 3-call success: δ and A worked out by hand; the last call
    bootstraps from nothing; calls past the end carry nothing."""
    values = torch.tensor([[0.2, 0.4, 0.6, 0.0]])
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    last = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    advantages, returns = chunk_advantages(values, rewards, last, gamma=0.9, lam=0.5)
    d2 = 1.0 - 0.6                     # r + γ·0 − V
    d1 = 0.0 + 0.9 * 0.6 - 0.4
    d0 = 0.0 + 0.9 * 0.4 - 0.2
    a2, a1 = d2, d1 + 0.45 * d2
    expected = torch.tensor([[d0 + 0.45 * a1, a1, a2, 0.0]])
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, expected + values)


def test_explained_variance_bounds():
    returns = torch.tensor([0.0, 1.0, 2.0, 3.0])
    assert explained_variance(returns, returns) == pytest.approx(1.0)
    assert explained_variance(torch.full((4,), 1.5), returns) == pytest.approx(0.0)
    assert explained_variance(returns, torch.ones(4)) == 0.0  # constant returns: nothing to explain


def _batch(policy, episodes=16, calls=3, seed=0):
    """Episodes of `calls` policy calls on random pictures; the first half succeeds, the second half fails, and the
    proprio tells them apart (+0.1 / −0.1), so a critic can learn which is which."""
    gen = torch.Generator().manual_seed(seed)
    image = torch.randint(0, 256, (episodes, calls, 3, 16, 16), generator=gen, dtype=torch.uint8)
    words = torch.as_tensor(policy.tokenizer.encode(["push left"] * episodes))[:, None].expand(-1, calls, -1)
    proprio = torch.ones(episodes, calls, 2) * 0.1
    proprio[episodes // 2:] *= -1
    flat = lambda x: x.reshape(episodes * calls, *x.shape[2:])  # noqa: E731
    tokens, logprobs = policy.sample(flat(image), flat(words), flat(proprio), 1.0, gen)
    unflat = lambda x: x.reshape(episodes, calls, -1).numpy()  # noqa: E731
    success = np.r_[np.ones(episodes // 2), np.zeros(episodes - episodes // 2)].astype(np.float32)
    return {"image": image.numpy(), "words": words.numpy(), "proprio": proprio.numpy(), "tokens": unflat(tokens),
            "logprobs": unflat(logprobs), "called": np.ones((episodes, calls), bool), "success": success}


@pytest.mark.parametrize("critic", ["shared", "separate"])
def test_the_first_update_favours_successful_tokens_and_the_critic_learns_the_returns(critic):
    """With the zero-initialized critic the first update's advantages are the returns: the successful episodes'
    sampled tokens gain log-probability against the failed ones'. Further updates on the batch fit the critic
    (explained variance from ≤ 0 to > 0.5)."""
    torch.manual_seed(0)
    make = lambda head: TinyVLA(["push", "left"], action_dim=1, chunk_size=2, proprio_dim=2,  # noqa: E731
                                image_size=16, bins=8, width=16, value_head=head)
    policy = make(critic == "shared")
    separate = make(True) if critic == "separate" else None
    cfg = PPOVLAConfig(critic=critic, epochs=2, minibatches=2, lr=1e-2, temperature=1.0, gamma=0.9)
    batch = _batch(policy)
    networks = [policy] + ([separate] if separate is not None else [])
    optimizer = torch.optim.Adam([p for net in networks for p in net.parameters()], lr=cfg.lr)
    flat = {k: torch.as_tensor(batch[k]).reshape(-1, *batch[k].shape[2:]) for k in ("image", "words", "proprio", "tokens")}

    def gap():  # mean log π of successful episodes' tokens minus the failed ones'
        with torch.no_grad():
            lp = policy.token_logprobs(flat["image"], flat["words"], flat["proprio"], flat["tokens"]).view(16, -1)
        return float(lp[:8].mean() - lp[8:].mean())

    before = gap()
    first = update_ppo_vla(policy, separate, optimizer, batch, cfg)
    assert first["value_mean"] == 0.0 and first["explained_variance"] <= 0.0  # the zero-initialized head
    assert first["advantage_mean"] > 0 and gap() > before + 0.1
    for _ in range(10):
        metrics = update_ppo_vla(policy, separate, optimizer, batch, cfg)
    assert metrics["explained_variance"] > 0.5, metrics
    assert metrics["policy_calls"] == 48 and np.isfinite(metrics["loss"])
    if critic == "separate":
        assert policy.value_head is None  # the policy itself carries no value head

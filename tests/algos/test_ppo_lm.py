"""Token-level PPO for LM policies (`algo=ppo_lm`): GAE over response tokens against hand values, the critic's
values at the right positions, and one update that fits the critic and moves the policy the right way."""
import dataclasses

import pytest
import torch

from rlfarm.algos.grpo_lm import GRPOConfig
from rlfarm.algos.ppo_lm import last_token, token_gae, whiten
from rlfarm.roles.llm import EngineRole, LMLearner, TextLabeler

CFG = GRPOConfig(prompts_per_step=6, group_size=1, filter_groups=False, advantage="gae", minibatches=2, seed=0)


def test_token_gae_pays_the_reward_on_the_last_token_and_matches_hand_values():
    values = torch.tensor([[0.5, 0.2, 0.1, 9.0], [0.3, 7.0, 7.0, 7.0]])  # values on padding must not leak in
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    advantages, returns = token_gae(torch.tensor([1.0, 0.5]), values, mask, gamma=1.0, lam=0.9)
    # row 0: δ = (0 + 0.2 − 0.5, 0 + 0.1 − 0.2, 1 − 0.1) = (−0.3, −0.1, 0.9); A2 = 0.9, A1 = −0.1 + 0.9·0.9 = 0.71,
    # A0 = −0.3 + 0.9·0.71 = 0.339. Row 1: one token, A = 0.5 − 0.3.
    torch.testing.assert_close(advantages, torch.tensor([[0.339, 0.71, 0.9, 0.0], [0.2, 0.0, 0.0, 0.0]]))
    torch.testing.assert_close(returns, torch.tensor([[0.839, 0.91, 1.0, 0.0], [0.5, 0.0, 0.0, 0.0]]))
    # γ < 1 discounts the reward on its way back: with V = 0 and λ = 1, A_t = γ^(T−1−t) r
    discounted, _ = token_gae(torch.tensor([1.0]), torch.zeros(1, 3), torch.ones(1, 3), gamma=0.5, lam=1.0)
    torch.testing.assert_close(discounted, torch.tensor([[0.25, 0.5, 1.0]]))


def test_last_token_and_whiten_see_only_real_tokens():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    assert last_token(mask).tolist() == [[0, 1, 0], [0, 0, 1], [0, 0, 0]]
    x = torch.tensor([[1.0, 3.0, 100.0], [1.0, 3.0, 2.0], [50.0, 50.0, 50.0]])
    w = whiten(x, mask)
    real = w[mask.bool()]
    assert abs(float(real.mean())) < 1e-6 and abs(float(real.std(unbiased=False)) - 1.0) < 1e-4
    assert (w[~mask.bool()] == 0).all()


def test_the_critic_values_the_state_that_chose_each_response_token():
    learner = LMLearner(CFG)
    critic = learner.critic.model
    assert torch.equal(critic.head.weight, torch.zeros_like(critic.head.weight))  # starts at V = 0
    torch.nn.init.normal_(critic.head.weight)
    (rollout, _) = EngineRole(CFG).generate()
    ids, mask, start = rollout.input_ids(), rollout.attention_mask(), rollout.prompt_ids.shape[1]
    with torch.no_grad():
        values = critic(ids, mask, start)
        from rlfarm.models.lm import position_ids_from_mask
        hidden = critic.backbone(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)
                                 ).last_hidden_state
    assert values.shape == rollout.response_mask.shape
    # token t of the response was chosen at position P + t − 1: the last prompt token chose the first one
    torch.testing.assert_close(values[:, 0], critic.head(hidden[:, start - 1]).squeeze(-1))
    # the critic starts from the policy's own weights (without LoRA), and trains apart from it
    policy_embed = learner.model.get_input_embeddings().weight
    assert torch.equal(critic.backbone.get_input_embeddings().weight, policy_embed)
    assert critic.backbone.get_input_embeddings().weight.data_ptr() != policy_embed.data_ptr()


def test_an_update_fits_the_critic_and_raises_the_better_samples_logprobs(one_torch_thread):
    generated = EngineRole(CFG).generate()
    rewards = TextLabeler(CFG).score(generated)
    assert rewards.max() > rewards.min()
    learner = LMLearner(dataclasses.replace(CFG, lr=3e-3, critic_lr=3e-3))
    rollout = generated[0]

    def logprobs():
        from rlfarm.models.lm import sequence_logprobs
        with torch.no_grad():
            lp = sequence_logprobs(learner.model, rollout.input_ids(), rollout.attention_mask(),
                                   rollout.prompt_ids.shape[1], rollout.temperature)
        return (lp * rollout.response_mask).sum(1)

    before = logprobs()
    losses = [learner.update(generated, rewards)["value_loss"] for _ in range(6)]
    assert losses[-1] < losses[0] / 2  # the critic fits the returns of this batch
    change = logprobs() - before
    best, worst = int(rewards.argmax()), int(rewards.argmin())
    assert change[best] > change[worst]  # the better answer gained probability relative to the worse one
    metrics = learner.update(generated, rewards)
    for key in ("loss", "value_loss", "value_mean", "return_mean", "value_rmse", "grad_norm", "reward"):
        assert key in metrics and torch.isfinite(torch.tensor(metrics[key])), key


@pytest.mark.parametrize("piece", [{"micro_batch_size": 2}, {"micro_batch_tokens": 22}], ids=["rows", "tokens"])
def test_critic_micro_batches_update_like_whole_minibatches(piece, one_torch_thread):
    # by rows, or by a token budget (the policy's pieces by tokens; the critic takes as many full-width rows as fit:
    # two of the rollout's width, 11, so each minibatch of three rows is cut too)
    generated = EngineRole(CFG).generate()
    rewards = TextLabeler(CFG).score(generated)
    whole, pieces = LMLearner(CFG), LMLearner(dataclasses.replace(CFG, **piece))
    widths = []
    pieces.critic.model.register_forward_pre_hook(lambda module, args: widths.append(args[0].numel()))
    results = []
    for learner in (whole, pieces):
        torch.manual_seed(1)  # the same minibatch permutations
        results.append(learner.update(generated, rewards))
    for key in ("loss", "value_loss", "grad_norm"):
        assert results[1][key] == pytest.approx(results[0][key], rel=1e-5, abs=1e-6), key
    for (name, a), (_, b) in zip(whole.critic.model.named_parameters(), pieces.critic.model.named_parameters()):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5, msg=name)
    budget = piece.get("micro_batch_tokens") or 2 * generated[0].input_ids().shape[1]
    assert widths and max(widths) <= budget  # no critic forward held more tokens than the budget


def test_a_checkpoint_holds_the_critic_and_its_optimizer(tmp_path, one_torch_thread):
    generated = EngineRole(CFG).generate()
    learner = LMLearner(CFG)
    learner.update(generated, TextLabeler(CFG).score(generated))
    learner.save(str(tmp_path / "c.pt"), {"updates": 1})
    restored = LMLearner(CFG)
    assert restored.load(str(tmp_path / "c.pt")) == {"updates": 1}
    for (name, a), (_, b) in zip(learner.critic.model.state_dict().items(), restored.critic.model.state_dict().items()):
        assert torch.equal(a, b), name
    optimizer_state = [c.critic.optimizer.state_dict()["state"] for c in (restored, learner)]
    assert optimizer_state[0].keys() == optimizer_state[1].keys()

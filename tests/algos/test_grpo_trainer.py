"""The stages of the reference GRPO trainer on plain data, and one cycle end to end."""
import numpy as np
import torch

from rlfarm.algos.grpo_trainer import GRPOConfig, build_parts, group_advantages, grpo_step, score_rollout
from rlfarm.engines.base import Rollout
from rlfarm.envs.text_tasks import DigitTokenizer
from rlfarm.rewards.verifiers import partial_credit


def test_score_rollout_decodes_up_to_eos_and_repeats_answers_per_group():
    tokenizer = DigitTokenizer()
    responses = [tokenizer.encode(text, add_bos=False) for text in ["1234$", "12345", "12$__", "9$___"]]
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    rollout = Rollout(prompt_ids=torch.ones(4, 1, dtype=torch.long), prompt_mask=torch.ones(4, 1, dtype=torch.long),
                      response_ids=torch.tensor(responses), response_mask=mask, logprobs=torch.zeros(4, 5),
                      group_size=2, temperature=1.0, weight_version=0)
    rewards = score_rollout(rollout, ["1234", "92"], tokenizer, partial_credit, tokenizer.eos_id)
    # "1234" vs 1234: 1; "12345" vs 1234: 4/5; "12" vs 92: 1/2; "9" vs 92: 1/2
    np.testing.assert_allclose(rewards, [1.0, 0.8, 0.5, 0.5])


def test_group_advantages_flag_groups_without_signal():
    advantages, keep = group_advantages(np.array([1.0, 0.0, 0.5, 0.5], dtype=np.float32), group_size=2)
    assert keep.tolist() == [True, False]
    assert advantages[2:].tolist() == [0.0, 0.0] and advantages[0] > 0 > advantages[1]
    assert group_advantages(np.array([0.5, 0.5]), group_size=2, filter_groups=False)[1].tolist() == [True]


def test_one_cycle_updates_the_policy_and_syncs_the_engine():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = GRPOConfig(prompts_per_step=4, group_size=4, minibatches=1, seed=0)
        parts = build_parts(cfg)
        before = {name: p.detach().clone() for name, p in parts.model.named_parameters()}
        metrics = grpo_step(parts, cfg, version=1)
    finally:
        torch.set_num_threads(threads)
    assert 0.0 <= metrics["reward"] <= 1.0 and metrics["kept_groups"] > 0
    assert abs(metrics["approx_kl"]) < 1e-6  # one on-policy step: π_θ = π_old when the loss is taken
    assert parts.engine.weight_version == 1
    engine_params = dict(parts.engine.model.named_parameters())
    assert any(not torch.equal(p, before[name]) for name, p in parts.model.named_parameters())
    assert all(torch.equal(p, engine_params[name]) for name, p in parts.model.named_parameters())

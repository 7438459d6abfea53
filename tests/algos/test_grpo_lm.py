"""The pure GRPO stages for LM policies on plain data: group advantages, and one update on a fresh rollout."""
import copy
import dataclasses

import numpy as np
import pytest
import torch

from rlfarm.algos.grpo import group_advantages
from rlfarm.algos.grpo_lm import TINY_QWEN2, GRPOConfig, rollout_metrics, update_policy
from rlfarm.engines.hf import HFEngine
from rlfarm.envs.text_tasks import DigitTask
from rlfarm.models.lm import causal_lm


def test_group_advantages_flag_groups_without_signal():
    advantages, keep = group_advantages(np.array([1.0, 0.0, 0.5, 0.5], dtype=np.float32), group_size=2)
    assert keep.tolist() == [True, False]
    assert advantages[2:].tolist() == [0.0, 0.0] and advantages[0] > 0 > advantages[1]
    assert group_advantages(np.array([0.5, 0.5]), group_size=2, filter_groups=False)[1].tolist() == [True]


def test_an_update_on_a_fresh_rollout_starts_on_policy_and_moves_the_policy(one_torch_thread):
    """The engine's logprobs are π_old: the first (only) minibatch step sees ratio 1 (approx_kl 0)."""
    cfg = GRPOConfig(prompts_per_step=4, group_size=4, minibatches=1, seed=0)
    torch.manual_seed(cfg.seed)
    task = DigitTask(cfg.task, cfg.num_digits, seed=cfg.seed)
    model = causal_lm({**TINY_QWEN2, "vocab_size": task.tokenizer.vocab_size}).eval()
    engine = HFEngine(copy.deepcopy(model), pad_id=task.tokenizer.pad_id, seed=cfg.seed)
    rollout = engine.generate(task.sample(cfg.prompts_per_step).prompt_ids, cfg.group_size, task.max_new_tokens,
                              cfg.temperature, eos_id=task.tokenizer.stop_ids)
    rewards = np.tile(np.arange(cfg.group_size, dtype=np.float32), cfg.prompts_per_step)  # every group has signal
    advantages, keep = group_advantages(rewards, cfg.group_size)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    metrics = rollout_metrics(rollout, rewards, keep) | update_policy(model, optimizer, rollout, advantages, cfg)
    assert metrics["kept_groups"] == 1.0 and metrics["response_len"] > 0 and metrics["entropy"] > 0
    assert abs(metrics["approx_kl"]) < 1e-6 and metrics["clip_fraction"] == 0.0
    assert any(not torch.equal(p, before[name]) for name, p in model.named_parameters())


def _digit_rollout(cfg):
    """A fresh tiny policy, one rollout of it on the digit task, and advantages with signal in every group.
    The engine's seed gives lengths that differ within groups, so the token-mean loss is far from 0 (at seed 0 the
    groups' length-weighted advantages cancel to ~1e-8 and loss ratios are rounding noise)."""
    torch.manual_seed(cfg.seed)
    task = DigitTask(cfg.task, cfg.num_digits, seed=cfg.seed)
    model = causal_lm({**TINY_QWEN2, "vocab_size": task.tokenizer.vocab_size}).eval()
    engine = HFEngine(copy.deepcopy(model), pad_id=task.tokenizer.pad_id, seed=cfg.seed + 2)
    rollout = engine.generate(task.sample(cfg.prompts_per_step).prompt_ids, cfg.group_size, task.max_new_tokens,
                              cfg.temperature, eos_id=task.tokenizer.stop_ids)
    advantages, _ = group_advantages(np.tile(np.arange(cfg.group_size, dtype=np.float32), cfg.prompts_per_step),
                                     cfg.group_size)
    return model, rollout, advantages


def test_the_engine_learner_mismatch_is_measured_before_the_first_step(one_torch_thread):
    """engine_logprob_gap (mean |Δ log p| per token) and engine_kl_k3 compare the engine's logprobs with the
    learner's before it steps: zero for the same weights, and exactly the injected gap when the engine is off."""
    cfg = GRPOConfig(prompts_per_step=4, group_size=4, minibatches=2, seed=0)
    model, rollout, advantages = _digit_rollout(cfg)
    fresh = copy.deepcopy(model)
    same = update_policy(model, torch.optim.AdamW(model.parameters(), lr=cfg.lr), rollout, advantages, cfg)
    assert same["engine_logprob_gap"] < 1e-5 and abs(same["engine_kl_k3"]) < 1e-6
    assert same["approx_kl"] > 0  # the second minibatch saw the stepped policy; the mismatch figures did not

    gap = 0.1  # an engine whose logprobs are all 0.1 above the learner's (a bf16 engine, another kernel)
    off = dataclasses.replace(rollout, logprobs=rollout.logprobs + gap * rollout.response_mask)
    skewed = update_policy(fresh, torch.optim.AdamW(fresh.parameters(), lr=cfg.lr), off, advantages, cfg)
    assert abs(skewed["engine_logprob_gap"] - gap) < 1e-4
    assert abs(skewed["engine_kl_k3"] - (np.exp(-gap) - 1 + gap)) < 1e-4  # k3 of log ρ = −0.1 per token


def test_truncated_importance_weights_per_token_and_per_sequence():
    from rlfarm.algos.grpo_lm import truncated_is_weights

    learner = torch.zeros(2, 3)
    engine = torch.tensor([[-0.5, 0.0, -2.0], [0.1, 0.1, 0.0]])  # log π_engine; the learner's are 0
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    weights, capped = truncated_is_weights(learner, engine, mask, "token_tis", cap=2.0)
    expected = torch.tensor([[np.exp(0.5), 1.0, 2.0], [np.exp(-0.1), np.exp(-0.1), 1.0]], dtype=torch.float32)
    assert torch.allclose(weights, expected)
    assert capped.item() == pytest.approx(1 / 5)  # one valid token of five over the cap
    weights, capped = truncated_is_weights(learner, engine, mask, "seq_tis", cap=2.0)
    assert torch.allclose(weights[0], torch.full((3,), 2.0))
    assert torch.allclose(weights[1], torch.full((3,), float(np.exp(-0.2))))
    assert capped.item() == pytest.approx(3 / 5)


@pytest.mark.parametrize("mode", ["token_tis", "seq_tis"])
def test_an_importance_corrected_update_anchors_the_ratio_on_the_learner_and_weighs_by_learner_over_engine(
        one_torch_thread, mode):
    """With the same weights in engine and learner the correction changes nothing; with an engine whose logprobs
    are all 0.1 too high, the clip's anchor stays the learner's (no ratio is clipped, as on policy) and the loss is
    the uncorrected one times exp(-0.1 per token) (token) or exp(-0.1 x length) (sequence)."""
    base = GRPOConfig(prompts_per_step=4, group_size=4, minibatches=1, seed=0)
    model, rollout, advantages = _digit_rollout(base)
    plain, corrected = copy.deepcopy(model), copy.deepcopy(model)
    cfg = dataclasses.replace(base, is_correction=mode, is_cap=10.0)
    reference = update_policy(plain, torch.optim.SGD(plain.parameters(), lr=0.0), rollout, advantages, base)
    same = update_policy(corrected, torch.optim.SGD(corrected.parameters(), lr=0.0), rollout, advantages, cfg)
    assert same["loss"] == pytest.approx(reference["loss"], rel=1e-5, abs=1e-7) and same["is_capped_fraction"] == 0

    off = dataclasses.replace(rollout, logprobs=rollout.logprobs + 0.1 * rollout.response_mask)
    skewed = update_policy(copy.deepcopy(model), torch.optim.SGD(model.parameters(), lr=0.0), off, advantages, cfg)
    assert skewed["clip_fraction"] == 0.0 and skewed["approx_kl"] < 1e-6  # anchored on the learner, not the engine
    assert skewed["engine_logprob_gap"] == pytest.approx(0.1, abs=1e-4)
    if mode == "token_tis":  # every token's weight is exp(-0.1): the loss scales by it
        assert skewed["loss"] == pytest.approx(np.exp(-0.1) * reference["loss"], rel=1e-4)
    else:  # a sequence of L tokens weighs exp(-0.1 L): the loss differs, and shrinks in magnitude
        assert abs(skewed["loss"]) < abs(reference["loss"])


@pytest.mark.parametrize("micro_batch_size", [None, 3], ids=["whole_minibatch", "row_pieces"])
def test_a_packed_update_without_a_token_budget_equals_the_padded_one(one_torch_thread, micro_batch_size):
    """`algo.packed` packs whatever pieces the learner cuts: a whole minibatch, or pieces of rows (the last padded
    with zero-weight rows) — the same loss, gradient norm and weights as the padded forwards, the padding never
    computed. (With `micro_batch_tokens` the pieces are cut by real tokens: tests/algos/test_micro_batches.py.)"""
    cfg = GRPOConfig(prompts_per_step=4, group_size=4, minibatches=2, seed=0, micro_batch_size=micro_batch_size,
                     kl_coef=0.05)
    _updates_agree(cfg, packed=True)


def _updates_agree(cfg: GRPOConfig, **changes) -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]:
    """One update of a fresh policy (`_digit_rollout`) under `cfg`, one of a copy under `cfg` with `changes`: the
    same loss, metrics and weights (SGD, lr 1). Returns (the policy before, updated under cfg, under the changes)."""
    model, rollout, advantages = _digit_rollout(cfg)
    results, policies = [], [copy.deepcopy(model) for _ in range(2)]
    for policy, settings in zip(policies, (cfg, dataclasses.replace(cfg, **changes))):
        torch.manual_seed(1)  # the same minibatch permutation
        results.append(update_policy(policy, torch.optim.SGD(policy.parameters(), lr=1.0), rollout, advantages,
                                     settings, ref_model=copy.deepcopy(model)))
    for key, expected in results[0].items():
        assert results[1][key] == pytest.approx(expected, rel=1e-5, abs=1e-6), key
    for (name, a), b in zip(policies[0].named_parameters(), policies[1].parameters()):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5, msg=name)
    return model, *policies


def test_packed_is_a_learner_option_off_by_default_and_on_in_the_speed_runs():
    from rlfarm.config import compose
    from rlfarm.errors import ConfigError
    from rlfarm.loops.llm import grpo_config

    assert grpo_config(compose("train", ["experiment=grpo_digits"])).packed is False
    assert grpo_config(compose("train", ["experiment=grpo_digits", "algo.packed=true"])).packed is True
    for experiment in ("grpo_long_tail", "grpo_7b_shape"):
        assert compose("train", [f"experiment={experiment}"]).algo.packed is True
    with pytest.raises(ConfigError, match="packed"):
        compose("train", ["experiment=grpo_digits", "algo.packed=sometimes"])


def test_an_update_with_compiled_blocks_equals_the_eager_one(one_torch_thread):
    """`algo.compile_layers`: `update_policy` compiles the policy's blocks at its first call (aot_eager on CPU,
    `rlfarm.models.compiled`) — the loss, metrics and weights of the eager update, over packed pieces of a token
    budget (lengths differ piece to piece), the TIS pre-pass (no gradients) and an eager KL reference."""
    from rlfarm.models.compiled import is_compiled
    from rlfarm.models.lm import decoder_blocks

    cfg = GRPOConfig(prompts_per_step=4, group_size=4, minibatches=2, seed=0, micro_batch_tokens=40, packed=True,
                     is_correction="token_tis", kl_coef=0.05)
    torch._dynamo.reset()
    model, eager, compiled = _updates_agree(cfg, compile_layers=True)
    torch._dynamo.reset()
    assert all(map(is_compiled, decoder_blocks(compiled)))
    assert not any(is_compiled(block) for policy in (model, eager) for block in decoder_blocks(policy))


def test_compile_layers_is_a_learner_option_off_by_default():
    from rlfarm.config import compose
    from rlfarm.errors import ConfigError
    from rlfarm.loops.llm import grpo_config

    assert grpo_config(compose("train", ["experiment=grpo_digits"])).compile_layers is False
    assert grpo_config(compose("train", ["experiment=grpo_7b_shape", "algo.compile_layers=true"])).compile_layers
    with pytest.raises(ConfigError, match="compile_layers"):
        compose("train", ["experiment=grpo_digits", "algo.compile_layers=sometimes"])

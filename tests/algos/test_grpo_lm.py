"""The pure GRPO stages for LM policies on plain data: group advantages, and one update on a fresh rollout."""
import copy
import dataclasses

import numpy as np
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


def test_the_engine_learner_mismatch_is_measured_before_the_first_step(one_torch_thread):
    """engine_logprob_gap (mean |Δ log p| per token) and engine_kl_k3 compare the engine's logprobs with the
    learner's before it steps: zero for the same weights, and exactly the injected gap when the engine is off."""
    cfg = GRPOConfig(prompts_per_step=4, group_size=4, minibatches=2, seed=0)
    torch.manual_seed(cfg.seed)
    task = DigitTask(cfg.task, cfg.num_digits, seed=cfg.seed)
    model = causal_lm({**TINY_QWEN2, "vocab_size": task.tokenizer.vocab_size}).eval()
    engine = HFEngine(copy.deepcopy(model), pad_id=task.tokenizer.pad_id, seed=cfg.seed)
    rollout = engine.generate(task.sample(cfg.prompts_per_step).prompt_ids, cfg.group_size, task.max_new_tokens,
                              cfg.temperature, eos_id=task.tokenizer.stop_ids)
    advantages, _ = group_advantages(np.tile(np.arange(cfg.group_size, dtype=np.float32), cfg.prompts_per_step),
                                     cfg.group_size)
    fresh = copy.deepcopy(model)
    same = update_policy(model, torch.optim.AdamW(model.parameters(), lr=cfg.lr), rollout, advantages, cfg)
    assert same["engine_logprob_gap"] < 1e-5 and abs(same["engine_kl_k3"]) < 1e-6
    assert same["approx_kl"] > 0  # the second minibatch saw the stepped policy; the mismatch figures did not

    gap = 0.1  # an engine whose logprobs are all 0.1 above the learner's (a bf16 engine, another kernel)
    off = dataclasses.replace(rollout, logprobs=rollout.logprobs + gap * rollout.response_mask)
    skewed = update_policy(fresh, torch.optim.AdamW(fresh.parameters(), lr=cfg.lr), off, advantages, cfg)
    assert abs(skewed["engine_logprob_gap"] - gap) < 1e-4
    assert abs(skewed["engine_kl_k3"] - (np.exp(-gap) - 1 + gap)) < 1e-4  # k3 of log ρ = −0.1 per token

"""Continuous refill in the static decoder, the per-sample noise that keeps it reproducible, and the synthetic
length model of speed runs: real tiny models on CPU."""
import copy

import pytest
import torch

from rlfarm.engines.hf import HFEngine
from rlfarm.engines.noise import column_keys, race_noise
from rlfarm.engines.static_decoder import buckets
from rlfarm.engines.synthetic_lengths import SyntheticLengths
from rlfarm.envs.text_tasks import DigitTask
from rlfarm.models.lm import build_causal_lm

PAD, EOS = 0, 2
TINY = {"model_type": "qwen2", "vocab_size": 15, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128}


def tiny_model(seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return build_causal_lm({**TINY, **overrides}).eval()


def engines(model, seed=3, **kwargs):
    """The fixed batch (every sample at once, today's engine) and a refilling engine of `kwargs` slots."""
    return (HFEngine(copy.deepcopy(model), pad_id=PAD, seed=seed, stop_check_every=2, refill=False),
            HFEngine(copy.deepcopy(model), pad_id=PAD, seed=seed, stop_check_every=2, **kwargs))


def assert_same_samples(a, b):
    assert torch.equal(a.response_mask, b.response_mask)
    assert torch.equal(a.response_ids, b.response_ids)
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)


def test_refill_gives_the_fixed_batch_samples_when_no_row_ends_early():
    fixed, refill = engines(tiny_model(), max_batch=4)
    prompts = [[1, 3 + i % 10, 4, 14][: 2 + i % 3] for i in range(6)]
    a = fixed.generate(prompts, n=2, max_new_tokens=7, temperature=1.0)  # no end token: every row to the cap
    b = refill.generate(prompts, n=2, max_new_tokens=7, temperature=1.0)
    assert a.response_ids.shape == (12, 7) and refill.last_call.slots == 4 and refill.last_call.prefills > 1
    assert_same_samples(a, b)


def test_long_answers_end_in_fewer_decode_steps_under_refill_with_the_same_samples():
    # a random model on copy_var: rows end on real end tokens at scattered steps
    task = DigitTask("copy_var", num_digits=12, seed=0)
    prompts = task.sample(24).prompt_ids
    model = tiny_model(seed=1)
    waves = HFEngine(copy.deepcopy(model), pad_id=PAD, seed=4, max_batch=8, refill=False)
    refill = HFEngine(copy.deepcopy(model), pad_id=PAD, seed=4, max_batch=8)
    a = waves.generate(prompts, n=2, max_new_tokens=40, temperature=1.0, eos_id=EOS)
    b = refill.generate(prompts, n=2, max_new_tokens=40, temperature=1.0, eos_id=EOS)
    lengths = a.response_mask.sum(dim=1)
    assert lengths.min() < 20 and lengths.max() > lengths.float().mean() + 5  # the lengths do vary
    assert_same_samples(a, b)
    assert refill.last_call.decode_steps < 0.8 * waves.last_call.decode_steps


def test_context_buckets_give_the_whole_row_samples_reading_fewer_columns():
    # refilled rows sit at different columns: each block attends up to the furthest one's bucket, never less
    task = DigitTask("copy_var", num_digits=12, seed=0)
    prompts = task.sample(12).prompt_ids
    model = tiny_model(seed=1)
    whole = HFEngine(copy.deepcopy(model), pad_id=PAD, seed=4, max_batch=8)
    cut = HFEngine(copy.deepcopy(model), pad_id=PAD, seed=4, max_batch=8)
    whole._static.context_step, cut._static.context_step = None, 4
    a = whole.generate(prompts, n=2, max_new_tokens=40, temperature=1.0, eos_id=EOS)
    b = cut.generate(prompts, n=2, max_new_tokens=40, temperature=1.0, eos_id=EOS)
    assert_same_samples(a, b)
    assert cut.last_call.decode_steps == whole.last_call.decode_steps and cut.last_call.prefills > 1
    assert cut.last_call.mean_context < 0.7 * whole.last_call.mean_context


def test_a_shrinking_batch_moves_rows_to_smaller_buckets_and_keeps_the_samples():
    assert buckets(40) == [40, 32, 16] and buckets(16) == [16] and buckets(5) == [5]
    model = tiny_model(seed=2, vocab_size=40)
    fixed, refill = engines(model, max_batch=40, synthetic_lengths={"median_frac": 0.2, "p99_frac": 1.0})
    fixed.lengths = refill.lengths
    prompts = [[1, 5 + i % 30, 7] for i in range(48)]
    a = fixed.generate(prompts, n=1, max_new_tokens=30, temperature=1.0, eos_id=EOS)
    b = refill.generate(prompts, n=1, max_new_tokens=30, temperature=1.0, eos_id=EOS)
    assert_same_samples(a, b)
    assert refill.last_call.smallest_bucket == 16 and fixed.last_call.smallest_bucket == 48  # the tail shrank


def test_synthetic_lengths_draw_the_configured_median_and_p99():
    model = SyntheticLengths(median_frac=1 / 3, p99_frac=1.0)
    lengths = model.draw(7, torch.arange(40_000), cap=1024).double()
    assert lengths.min() >= 1 and lengths.max() == 1024
    assert lengths.median().item() == pytest.approx(1024 / 3, rel=0.03)
    assert (lengths >= 1024).double().mean().item() == pytest.approx(0.01, abs=0.003)  # p99 at the cap
    assert torch.quantile(lengths, 0.9).item() == pytest.approx(1024 / 3 * 3 ** (1.2816 / 2.3263), rel=0.04)
    again = model.draw(7, torch.arange(40_000), cap=1024)
    assert torch.equal(again, lengths.long()) and not torch.equal(model.draw(8, torch.arange(40_000), 1024), again)
    with pytest.raises(ValueError, match="median_frac < p99_frac"):
        SyntheticLengths(median_frac=0.5, p99_frac=0.4)


def test_synthetic_lengths_end_each_sample_on_a_forced_end_token():
    model = tiny_model(vocab_size=200)
    engine = HFEngine(model, pad_id=PAD, seed=1, max_batch=8, synthetic_lengths={"median_frac": 0.3, "p99_frac": 1.0})
    rollout = engine.generate([[1, 5, 6]] * 16, n=2, max_new_tokens=24, temperature=1.0, eos_id=EOS)
    lengths = rollout.response_mask.sum(dim=1)
    assert len(set(lengths.tolist())) > 4  # varied
    for row, length in enumerate(lengths.tolist()):
        if length < 24:  # ended early: on the end token, with its log-prob under the policy (finite, negative)
            assert rollout.response_ids[row, length - 1] == EOS
            assert -50 < rollout.logprobs[row, length - 1] < 0


def test_noise_is_exponential_and_keyed_by_sample_and_token_only():
    seed = torch.tensor(11)
    ids, steps = torch.arange(64), torch.arange(64) % 5
    noise = race_noise(seed, ids, steps, column_keys(4096, 'cpu'))
    assert noise.mean().item() == pytest.approx(1.0, abs=0.01) and noise.min() > 0
    assert noise.std().item() == pytest.approx(1.0, abs=0.02)
    order = torch.randperm(64)  # a sample's noise does not depend on its row
    assert torch.equal(race_noise(seed, ids[order], steps[order], column_keys(4096, 'cpu')), noise[order])
    assert not torch.equal(race_noise(seed, ids, steps + 1, column_keys(4096, 'cpu')), noise)

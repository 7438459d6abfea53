"""A prompt runs through the static decoder once per call; its later samples start from a copy of a cache row that
holds it (`rlfarm.engines.prompt_donors`): the same samples as running it again, fewer forwards. Real tiny models
on CPU."""
import copy
import itertools

import torch

from rlfarm.engines.hf import HFEngine
from rlfarm.engines.prompt_donors import PromptDonors, copy_prompt_rows
from tests.engines.test_refill import EOS, PAD, assert_same_samples, tiny_model

LENGTHS = {"median_frac": 0.3, "p99_frac": 1.0}  # rows end at scattered steps: a group's samples start apart


def shared_and_rerun(model, **kwargs):
    shared = HFEngine(copy.deepcopy(model), pad_id=PAD, seed=5, stop_check_every=2, **kwargs)
    rerun = HFEngine(copy.deepcopy(model), pad_id=PAD, seed=5, stop_check_every=2, **kwargs)
    rerun._static.share_prompts = False
    return shared, rerun


def test_a_group_s_later_samples_start_from_a_copy_and_sample_what_a_second_forward_would():
    model = tiny_model(seed=3, vocab_size=40)
    shared, rerun = shared_and_rerun(model, max_batch=6, synthetic_lengths=LENGTHS)
    prompts = [[1, 5 + i % 30, 7, 9 + i % 4][: 2 + i % 3] for i in range(10)]  # left-padded to different lengths
    a = shared.generate(prompts, n=4, max_new_tokens=24, temperature=1.0, eos_id=EOS)
    b = rerun.generate(prompts, n=4, max_new_tokens=24, temperature=1.0, eos_id=EOS)
    assert_same_samples(a, b)
    assert shared.last_call.prompt_forwards == len(prompts) and shared.last_call.prompt_copies > 0
    assert rerun.last_call.prompt_forwards > len(prompts) and rerun.last_call.prompt_copies == 0


def test_a_prompt_keeps_only_its_last_hidden_state_not_the_whole_forward_s():
    """The donors hold one hidden vector per prompt for the whole call: a view of the forward's [prompts, P, hidden]
    output would keep all of it alive (P times the memory; ~0.5 GB at 7B, P = 256)."""
    from rlfarm.engines.prefill import run_prompts

    engine = HFEngine(tiny_model(seed=3, vocab_size=40), pad_id=PAD, seed=5, max_batch=4)
    decoder, prompts = engine._static, torch.tensor([[1, 5, 7, 9, 4, 6], [0, 0, 1, 8, 8, 3]])
    state, _, _ = decoder.prepare(4, 6, 4, engine._sampling(1.0, 1.0, EOS))
    distinct, last, counts = run_prompts(decoder, state, prompts, (prompts > 0).long(), [0, 1, 2], [0, 0, 1])
    assert distinct == [0, 1] and counts.tolist() == [2, 1] and last.shape == (2, 32)
    assert last.untyped_storage().nbytes() == last.numel() * last.element_size()


def test_new_weights_between_checks_run_the_prompts_again():
    """Partial rollouts: a donor's keys/values are the old weights', so a prompt runs again under the new ones."""
    model = tiny_model(seed=3, vocab_size=40)
    engine = HFEngine(copy.deepcopy(model), pad_id=PAD, seed=5, stop_check_every=2, max_batch=6,
                      synthetic_lengths=LENGTHS)
    versions = itertools.count()
    engine._weights_now = lambda: next(versions)  # (the weights stay the same: only the version moves)
    engine.generate([[1, 5 + i, 7] for i in range(10)], n=4, max_new_tokens=24, temperature=1.0, eos_id=EOS)
    assert engine.last_call.prompt_copies == 0 and engine.last_call.prompt_forwards > 10


def test_donors_follow_their_slots_and_a_new_version_forgets_them():
    donors = PromptDonors()
    donors.at_version(0)
    donors.record([0, 1, 2], [7, 7, 8])
    assert donors.split([3, 4, 5], [7, 8, 9]) == ([0, 1], [2])
    donors.record([0, 1], [9, 9])  # both rows of prompt 7 taken by prompt 9
    assert donors.split([3], [7]) == ([], [0]) and donors.donor(9) == 0 and donors.donor(8) == 2
    donors.at_version(0)
    assert donors.donor(8) == 2
    donors.at_version(1)
    assert donors.split([3], [8]) == ([], [0])


def test_a_row_can_be_a_donor_and_a_target_of_the_same_fill():
    cache = torch.arange(3 * 1 * 4 * 2, dtype=torch.float32).reshape(3, 1, 4, 2)
    before = cache.clone()
    copy_prompt_rows([cache], targets=torch.tensor([0, 1]), donors=torch.tensor([1, 0]), prompt_len=2)
    assert torch.equal(cache[0, :, :2], before[1, :, :2]) and torch.equal(cache[1, :, :2], before[0, :, :2])
    assert not cache[:2, :, 2:].any() and torch.equal(cache[2], before[2])  # the rest of a target row zeroed

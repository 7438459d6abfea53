import copy

import pytest
import torch

from rlfarm.engines.hf import HFEngine, left_pad, nucleus_filter, sample_tokens
from rlfarm.models.lm import build_causal_lm, position_ids_from_mask, sequence_logprobs, trainable_state_dict

PAD, EOS = 0, 2
TINY = {"model_type": "qwen2", "vocab_size": 15, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}


def tiny_model(seed: int = 0, model_type: str = "qwen2"):
    torch.manual_seed(seed)
    return build_causal_lm({**TINY, "model_type": model_type}).eval()


def greedy_without_cache(model, prompt: list[int], steps: int) -> list[int]:
    """Reference decoder: full forward of the unpadded sequence each step, argmax."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


PROMPTS = [[1, 5, 6, 7, 8, 14], [1, 9, 14], [1, 3, 4, 5, 6, 7, 8, 9, 14]]


@pytest.mark.parametrize("model_type", ["qwen2", "llama"])
def test_engine_logprobs_equal_learner_logprobs(model_type):
    model = tiny_model(model_type=model_type)
    engine = HFEngine(copy.deepcopy(model), pad_id=PAD, seed=0)
    rollout = engine.generate(PROMPTS, n=4, max_new_tokens=8, temperature=0.7, eos_id=EOS)
    assert rollout.response_ids.shape[0] == 12 and rollout.group_size == 4 and rollout.num_prompts == 3
    with torch.no_grad():
        learner = sequence_logprobs(model, rollout.input_ids(), rollout.attention_mask(),
                                    rollout.prompt_ids.shape[1], temperature=rollout.temperature)
    mask = rollout.response_mask.bool()
    assert (learner[mask] - rollout.logprobs[mask]).abs().max().item() < 1e-4


def test_greedy_matches_a_cache_free_reference_and_left_padding_is_invisible():
    model = tiny_model()
    engine = HFEngine(copy.deepcopy(model), pad_id=PAD)
    short = PROMPTS[1]
    alone = engine.generate([short], n=1, max_new_tokens=6, temperature=0.0).response_ids[0].tolist()
    batched = engine.generate(PROMPTS, n=2, max_new_tokens=6, temperature=0.0)
    assert alone == greedy_without_cache(model, short, 6)
    assert batched.response_ids[2].tolist() == batched.response_ids[3].tolist() == alone
    for row, prompt in enumerate(PROMPTS):
        assert batched.response_ids[2 * row].tolist() == greedy_without_cache(model, prompt, 6)


def test_update_weights_makes_engine_follow_the_learner():
    model = tiny_model(seed=0)
    engine = HFEngine(tiny_model(seed=1), pad_id=PAD)  # different weights before the sync
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    ids = torch.tensor([[1, 5, 6, 14, 5, 6]])
    (-sequence_logprobs(model, ids, torch.ones_like(ids), 4).sum()).backward()
    optimizer.step()
    model.eval()
    engine.update_weights(trainable_state_dict(model), version=7)
    rollout = engine.generate(PROMPTS, n=1, max_new_tokens=5, temperature=0.0)
    assert rollout.weight_version == 7
    for row, prompt in enumerate(PROMPTS):
        assert rollout.response_ids[row].tolist() == greedy_without_cache(model, prompt, 5)
    with pytest.raises(KeyError, match="no tensor 'nope'"):
        engine.update_weights({"nope": torch.zeros(1)}, version=8)


def test_eos_ends_a_sample_and_padding_follows():
    engine = HFEngine(tiny_model(), pad_id=PAD, seed=0, stop_check_every=2)
    # EOS is one token in 15, so over 64 samples × 12 steps many samples stop early
    rollout = engine.generate(PROMPTS[:2], n=32, max_new_tokens=12, temperature=1.5, eos_id=EOS)
    lengths = rollout.response_mask.sum(1)
    assert (lengths < rollout.response_ids.shape[1]).any()
    for ids, mask, logprobs, length in zip(rollout.response_ids, rollout.response_mask, rollout.logprobs, lengths):
        n = int(length)
        assert mask[:n].all() and not mask[n:].any()
        assert (ids[n:] == PAD).all() and (logprobs[n:] == 0).all()
        assert EOS not in ids[:n - 1].tolist()  # an EOS can only be the last valid token
        if n < len(ids):
            assert ids[n - 1] == EOS
    completions = rollout.completion_ids(EOS)
    assert all(EOS not in c for c in completions)
    assert [len(c) for c in completions] == [int(n) - int(ids[int(n) - 1] == EOS) for ids, n in
                                             zip(rollout.response_ids, lengths)]


def test_generation_stops_when_every_sample_ended():
    model = tiny_model()
    greedy = greedy_without_cache(model, PROMPTS[0], 1)[0]
    engine = HFEngine(model, pad_id=PAD, stop_check_every=1)
    # make the first greedy token the EOS: every sample ends at step 1, no more steps are run
    rollout = engine.generate([PROMPTS[0]], n=3, max_new_tokens=10, temperature=0.0, eos_id=greedy)
    assert rollout.response_ids.shape == (3, 1) and rollout.completion_ids(greedy) == [[], [], []]


@pytest.mark.parametrize("decoder", ["hf", "static"])
def test_any_of_several_stop_ids_ends_a_sample(decoder):
    model = tiny_model()
    greedy = greedy_without_cache(model, PROMPTS[0], 10)
    assert greedy[0] != greedy[1]  # the fixture's model: so the second token is where it stops
    engine = HFEngine(model, pad_id=PAD, stop_check_every=1, decoder=decoder)
    never = next(i for i in range(3, 30) if i not in greedy)
    # the second greedy token is one of two stop ids: 2 steps, and completions leave it out
    rollout = engine.generate([PROMPTS[0]], n=2, max_new_tokens=10, temperature=0.0, eos_id=[never, greedy[1]])
    assert rollout.response_ids.shape == (2, 2) and rollout.response_mask.sum().item() == 4
    assert rollout.completion_ids([greedy[1], never]) == [[greedy[0]], [greedy[0]]]
    assert engine.generate([PROMPTS[0]], n=1, max_new_tokens=10, temperature=0.0,
                           eos_id=[never]).response_ids.shape == (1, 10)


def test_select_groups_keeps_whole_groups():
    engine = HFEngine(tiny_model(), pad_id=PAD)
    rollout = engine.generate(PROMPTS, n=2, max_new_tokens=3, temperature=1.0)
    kept = rollout.select_groups(torch.tensor([True, False, True]))
    assert kept.num_prompts == 2
    torch.testing.assert_close(kept.response_ids, rollout.response_ids[[0, 1, 4, 5]])
    torch.testing.assert_close(kept.prompt_ids, rollout.prompt_ids[[0, 1, 4, 5]])


def test_sleep_and_wake_keep_the_weights():
    engine = HFEngine(tiny_model(), pad_id=PAD)
    before = engine.generate(PROMPTS, n=1, max_new_tokens=4, temperature=0.0).response_ids
    engine.sleep()
    engine.wake()
    torch.testing.assert_close(engine.generate(PROMPTS, n=1, max_new_tokens=4, temperature=0.0).response_ids, before)


def test_a_sleep_that_drops_the_synced_weights_wakes_to_whatever_the_next_sync_brings():
    learner, engine = tiny_model(), HFEngine(tiny_model(), pad_id=PAD)
    with torch.no_grad():
        for param in learner.parameters():
            param.add_(0.1)
    synced = {name: t.detach().clone() for name, t in learner.named_parameters()}
    expected = HFEngine(learner, pad_id=PAD).generate(PROMPTS, n=1, max_new_tokens=4, temperature=0.0).response_ids
    engine.sleep(discard=synced.keys())
    assert all(engine.model.get_parameter(name).numel() == 0 for name in synced)  # dropped, not kept on the host
    engine.wake()
    assert all(engine.model.get_parameter(name).shape == t.shape for name, t in synced.items())
    engine.update_weights(synced, version=1)
    torch.testing.assert_close(engine.generate(PROMPTS, n=1, max_new_tokens=4, temperature=0.0).response_ids, expected)
    with pytest.raises(KeyError, match="no tensor 'nope'"):
        engine.sleep(discard=["nope"])


def test_sampling_follows_the_tempered_distribution():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2])).repeat(40000, 1)
    generator = torch.Generator().manual_seed(0)
    tokens, logprobs = sample_tokens(logits, temperature=1.0, generator=generator)
    frequencies = torch.bincount(tokens, minlength=3).float() / len(tokens)
    torch.testing.assert_close(frequencies, torch.tensor([0.5, 0.3, 0.2]), atol=0.01, rtol=0)
    torch.testing.assert_close(logprobs, torch.log(torch.tensor([0.5, 0.3, 0.2]))[tokens])
    # temperature 2 flattens p ∝ p^(1/2); the log-prob is under that tempered distribution
    tokens, logprobs = sample_tokens(logits[:1], temperature=2.0, generator=generator)
    tempered = torch.log_softmax(logits[0] / 2.0, dim=-1)
    assert logprobs.item() == pytest.approx(tempered[tokens].item())


def test_nucleus_filter_keeps_the_smallest_set_reaching_top_p():
    logp = torch.log(torch.tensor([[0.2, 0.5, 0.3]]))
    kept = lambda top_p: torch.isfinite(nucleus_filter(logp, top_p))[0].tolist()  # noqa: E731
    assert kept(0.45) == [False, True, False]
    assert kept(0.6) == [False, True, True]
    assert kept(0.85) == [True, True, True]


def test_left_pad_and_positions():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=PAD)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert position_ids_from_mask(mask).tolist() == [[0, 1, 2], [0, 0, 0]]


def test_vllm_adapter_says_what_to_install():
    try:  # vllm cannot be installed on these machines; should it ever be, there is nothing to check
        import vllm  # noqa: F401
        pytest.skip("vllm is installed")
    except ImportError:
        pass
    from rlfarm.engines.vllm import VLLMEngine

    with pytest.raises(ImportError) as error:
        VLLMEngine("some/model", pad_id=0)
    assert str(error.value) == ("engine=vllm needs the vllm extra: pip install 'rlfarm[vllm]' on a CUDA machine; "
                                "use engine=hf")


@pytest.mark.parametrize("model_type", ["qwen2", "gpt2"])  # the static decoder, and the HF-cache loop
def test_engines_splitting_a_step_generate_what_one_engine_would(model_type):
    """Data-parallel rollout: two engines, each with its rows of the step's sampling noise (`Rows`) and the same
    seed, give the samples one engine gives for the whole step, row for row."""
    from rlfarm.data import concat_rollouts
    from rlfarm.engines.sampling import Rows

    model = tiny_model(model_type=model_type)
    prompts, n = PROMPTS + [[1, 7, 14]], 3
    whole = HFEngine(copy.deepcopy(model), pad_id=PAD, seed=5).generate(prompts, n, 6, eos_id=EOS)
    parts = [HFEngine(copy.deepcopy(model), pad_id=PAD, seed=5).generate(prompts[first:first + 2], n, 6, eos_id=EOS,
                                                                          rows=Rows(first * n, len(prompts) * n))
             for first in (0, 2)]
    joined = concat_rollouts(parts)
    assert joined.response_ids.shape == whole.response_ids.shape
    rows = whole.response_mask.bool()
    assert torch.equal(joined.response_mask, whole.response_mask)
    assert torch.equal(joined.response_ids[rows], whole.response_ids[rows])
    torch.testing.assert_close(joined.logprobs, whole.logprobs, atol=1e-5, rtol=0)
    assert torch.equal(joined.prompt_mask, whole.prompt_mask)
    assert torch.equal(joined.prompt_ids[joined.prompt_mask.bool()], whole.prompt_ids[whole.prompt_mask.bool()])
    # the other engine's rows are not these: a part alone (rows of its own) samples differently
    alone = HFEngine(copy.deepcopy(model), pad_id=PAD, seed=5).generate(prompts[2:], n, 6, eos_id=EOS)
    assert not torch.equal(alone.response_ids, whole.response_ids[2 * n:, :alone.response_ids.shape[1]])

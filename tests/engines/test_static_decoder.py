"""The static-cache decoder (the fast path of HFEngine for Llama-family models) against the HF-cache loop
and the learner; on CUDA, its graphed step against its eager step."""
import copy

import pytest
import torch

from rlfarm.engines.hf import HFEngine
from rlfarm.engines.buckets import buckets, contexts
from rlfarm.engines import decode_graphs
from rlfarm.engines.static_decoder import CACHE_ROUNDING, StaticDecoder, supports
from rlfarm.models.lm import build_causal_lm, causal_lm, sequence_logprobs

PAD, EOS = 0, 2
TINY = {"vocab_size": 15, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
PROMPTS = [[1, 5, 6, 7, 8, 14], [1, 9, 14], [1, 3, 4, 5, 6, 7, 8, 9, 14]]


def tiny_model(model_type: str = "qwen2", seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return build_causal_lm({**TINY, "model_type": model_type, **overrides}).eval()


def both_decoders(model, **kwargs):
    return (HFEngine(copy.deepcopy(model), pad_id=PAD, decoder="static", **kwargs),
            HFEngine(copy.deepcopy(model), pad_id=PAD, decoder="hf", **kwargs))


def test_auto_takes_the_static_decoder_for_the_llama_family_only():
    assert supports(tiny_model("qwen2")) and supports(tiny_model("llama")) and supports(tiny_model("qwen3"))
    assert not supports(build_causal_lm({"model_type": "gpt2", "vocab_size": 15, "n_embd": 32, "n_layer": 1,
                                         "n_head": 2, "n_positions": 64}))
    assert HFEngine(tiny_model(), pad_id=PAD)._static is not None
    with pytest.raises(ValueError, match="StaticDecoder runs"):
        HFEngine(build_causal_lm({"model_type": "gpt2", "vocab_size": 15, "n_embd": 32, "n_layer": 1,
                                  "n_head": 2, "n_positions": 64}), pad_id=PAD, decoder="static")


@pytest.mark.parametrize("model_type", ["qwen2", "llama", "qwen3"])
def test_static_and_hf_cache_decoders_sample_the_same_tokens(model_type):
    # both draw the race noise from the same seeded generator in the same order, so up to float rounding
    # they are the same sampler: same tokens, same log-probs, same end of sequence
    static, hf = both_decoders(tiny_model(model_type), seed=3, stop_check_every=1)
    for temperature, top_p in [(0.7, 1.0), (1.3, 0.8)]:
        a = static.generate(PROMPTS, n=4, max_new_tokens=9, temperature=temperature, top_p=top_p, eos_id=EOS)
        b = hf.generate(PROMPTS, n=4, max_new_tokens=9, temperature=temperature, top_p=top_p, eos_id=EOS)
        assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
        assert torch.equal(a.prompt_ids, b.prompt_ids) and torch.equal(a.prompt_mask, b.prompt_mask)


def test_logprobs_equal_the_learners_with_lora_and_grouped_queries():
    torch.manual_seed(0)
    model = causal_lm({**TINY, "model_type": "qwen2"}, lora={"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]})
    with torch.no_grad():  # adapters start at zero; give them weight so they matter
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.3)
    model.eval()
    engine = HFEngine(copy.deepcopy(model), pad_id=PAD, seed=1)
    assert engine._static is not None
    rollout = engine.generate(PROMPTS, n=3, max_new_tokens=7, temperature=0.9, eos_id=EOS)
    with torch.no_grad():
        learner = sequence_logprobs(model, rollout.input_ids(), rollout.attention_mask(),
                                    rollout.prompt_ids.shape[1], temperature=rollout.temperature)
    mask = rollout.response_mask.bool()
    assert (learner[mask] - rollout.logprobs[mask]).abs().max().item() < 1e-4


def test_a_cache_reused_across_calls_holds_nothing_of_the_last_call():
    model = tiny_model()
    engine = HFEngine(copy.deepcopy(model), pad_id=PAD)
    fresh = HFEngine(copy.deepcopy(model), pad_id=PAD)
    long_first = engine.generate([PROMPTS[2]] * 3, n=1, max_new_tokens=8, temperature=0.0)
    # same batch and cache bucket, shorter prompts: slots the last call filled must not leak in
    again = engine.generate(PROMPTS, n=1, max_new_tokens=8, temperature=0.0)
    assert len(engine._static.states) == 1 and next(iter(engine._static.states))[1] == CACHE_ROUNDING
    assert torch.equal(again.response_ids, fresh.generate(PROMPTS, n=1, max_new_tokens=8, temperature=0.0).response_ids)
    assert long_first.response_ids.shape == (3, 8)


def test_cache_shapes_beyond_the_limit_are_dropped_oldest_first():
    engine = HFEngine(tiny_model(), pad_id=PAD)
    for batch in (1, 2, 3, 4):
        engine.generate(PROMPTS[:1] * batch, n=1, max_new_tokens=2, temperature=0.0)
    # keyed by (slots, cache length)
    assert list(engine._static.states) == [(b, CACHE_ROUNDING) for b in (2, 3, 4)]
    engine.sleep()
    assert not engine._static.states
    engine.wake()
    assert engine.generate(PROMPTS, n=1, max_new_tokens=2, temperature=0.0).response_ids.shape == (3, 2)


def test_auto_capture_is_ahead_until_the_first_sleep_then_first_use():
    engine = HFEngine(tiny_model(), pad_id=PAD, capture="auto")
    assert engine._static.capture == "ahead"  # an engine that never sleeps keeps its graphs: capture them once, ahead
    engine.sleep()
    engine.wake()
    assert engine._static.capture == "first_use"  # each sleep drops them: from now on only the pairs a call steps
    assert engine.generate(PROMPTS, n=1, max_new_tokens=2, temperature=0.0).response_ids.shape == (3, 2)
    with pytest.raises(ValueError, match="capture must be one of"):
        HFEngine(tiny_model(), pad_id=PAD, capture="later")


def test_first_use_steps_a_pair_eagerly_twice_then_captures_it_once_and_replays(monkeypatch):
    # the sequencing alone, on a CPU: a stand-in "graph" replays the step it was captured from (the GPU tests below
    # check real graphs against eager steps)
    # the views stepped, in order; where the current call's steps start; per capture, its view's steps in the call
    steps, call_start, eager_before_capture = [], [0], []

    def capture(root, key, run):
        eager_before_capture.append(steps[call_start[0]:].count(id(root.view(key[0], key[1]))))
        root.graphs[key] = type("Replay", (), {"replay": staticmethod(run)})()
        return root.graphs[key]

    monkeypatch.setattr(decode_graphs, "capture", capture)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(StaticDecoder, "graphed", property(lambda self: self.cuda_graphs))  # as if on CUDA
    lengths = {"median_frac": 0.2, "p99_frac": 1.0}
    graphed = HFEngine(tiny_model(), pad_id=PAD, seed=5, max_batch=40, synthetic_lengths=lengths, capture="first_use")
    eager = HFEngine(tiny_model(), pad_id=PAD, seed=5, max_batch=40, synthetic_lengths=lengths, cuda_graphs=False)
    decoder = graphed._static
    decoder.context_step = eager._static.context_step = 8  # several (batch, context) pairs
    prompts = [[3 + (i * 7 + j) % 12 for j in range(5 + i % 4)] for i in range(24)]
    monkeypatch.setattr(decoder, "_step", lambda state, sampling: steps.append(id(state))
                        or StaticDecoder._step(decoder, state, sampling))
    for call in range(2):
        call_start[0] = len(steps)
        a = graphed.generate(prompts, n=3, max_new_tokens=30, temperature=1.0, eos_id=EOS)
        b = eager.generate(prompts, n=3, max_new_tokens=30, temperature=1.0, eos_id=EOS)
        assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.logprobs, b.logprobs)
        assert decoder.last_call.eager_steps >= 2 * decoder.last_call.graphs_captured
    assert decoder.graphs_captured == len(eager_before_capture) == len(next(iter(decoder.states.values())).graphs)
    assert len(eager_before_capture) > 3 and set(eager_before_capture) == {2}  # two eager steps in the call, then it


def test_first_use_counts_its_eager_steps_again_in_each_call(monkeypatch):
    # a pair stepped once in one call is stepped eagerly again at its first step in the next: a capture always
    # follows two eager runs in the same call (the state's memory may have been freed and allocated anew between)
    ran, captured = [], []
    monkeypatch.setattr(decode_graphs, "capture", lambda root, key, run: captured.append(key)
                        or root.graphs.setdefault(key, type("Replay", (), {"replay": staticmethod(run)})()))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    root = type("Root", (), {"graphs": {}})()
    earlier = decode_graphs.FirstUse(root, "pair", lambda: ran.append("earlier"), "cpu", lambda s: None)
    earlier()
    this_call = decode_graphs.FirstUse(root, "pair", lambda: ran.append("this"), "cpu", lambda s: None)
    this_call()
    this_call()
    assert not captured and ran == ["earlier", "this", "this"]
    this_call()  # its third step in this call: captured, then replayed
    assert captured == ["pair"] and ran[-1] == "this" and len(ran) == 4


@pytest.mark.gpu
@pytest.mark.parametrize("compile", [False, True])
def test_cuda_graphed_steps_equal_eager_steps_and_the_learner(compile):
    model = tiny_model("qwen2", vocab_size=1000, num_hidden_layers=3).cuda()
    graphed = HFEngine(copy.deepcopy(model), pad_id=PAD, device="cuda", seed=5, compile=compile)
    eager = HFEngine(copy.deepcopy(model), pad_id=PAD, device="cuda", seed=5, cuda_graphs=False)
    prompts = [[1 + (i * 7 + j) % 900 for j in range(5 + i % 4)] for i in range(6)]
    for _ in range(2):  # the second call replays the captured graph on a reused cache
        a = graphed.generate(prompts, n=4, max_new_tokens=20, temperature=1.0, eos_id=EOS)
        b = eager.generate(prompts, n=4, max_new_tokens=20, temperature=1.0, eos_id=EOS)
        assert torch.equal(a.response_ids, b.response_ids)
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
    with torch.no_grad():
        learner = sequence_logprobs(model, a.input_ids().cuda(), a.attention_mask().cuda(), a.prompt_ids.shape[1])
    mask = a.response_mask.bool()
    assert (learner.cpu()[mask] - a.logprobs[mask]).abs().max().item() < 1e-4
    # in-place weight updates reach the captured graph
    other = tiny_model("qwen2", seed=9, vocab_size=1000, num_hidden_layers=3)
    graphed.update_weights(dict(other.named_parameters()), version=1)
    expected = HFEngine(other.cuda(), pad_id=PAD, device="cuda", cuda_graphs=False)
    assert torch.equal(graphed.generate(prompts, n=1, max_new_tokens=6, temperature=0.0).response_ids,
                       expected.generate(prompts, n=1, max_new_tokens=6, temperature=0.0).response_ids)


@pytest.mark.gpu
@pytest.mark.parametrize("capture", ["ahead", "first_use"])
@pytest.mark.parametrize("compile", [False, True])
def test_cuda_graphed_refill_through_buckets_equals_the_eager_fixed_batch(compile, capture):
    # 72 samples through 40 slots: refills, then the tail shrinks to the 32- and 16-row buckets' graphs; the graphed
    # engine attends to context buckets 8 columns apart (a graph per pair, one pool) through the per-row kernel
    # (rlfarm.engines.decode_attention), the eager one to whole rows through the masked matmuls; the graphs are
    # captured before each call or at a pair's third step in it, between steps of the call in flight
    model = tiny_model("qwen2", vocab_size=1000, num_hidden_layers=3).cuda()
    lengths = {"median_frac": 0.2, "p99_frac": 1.0}
    graphed = HFEngine(copy.deepcopy(model), pad_id=PAD, device="cuda", seed=5, compile=compile, max_batch=40,
                       synthetic_lengths=lengths, capture=capture)  # first_use: a pair's first 2 steps eager
    eager = HFEngine(copy.deepcopy(model), pad_id=PAD, device="cuda", seed=5, cuda_graphs=False,
                     synthetic_lengths=lengths)
    graphed._static.context_step, eager._static.context_step = 8, None
    eager._static.attention = "matmul"
    assert graphed._static.row_kernel and not eager._static.row_kernel
    prompts = [[1 + (i * 7 + j) % 900 for j in range(5 + i % 4)] for i in range(24)]
    for call in range(2):  # the second call replays the captured graphs on a reused cache
        a = graphed.generate(prompts, n=3, max_new_tokens=30, temperature=1.0, eos_id=EOS)
        b = eager.generate(prompts, n=3, max_new_tokens=30, temperature=1.0, eos_id=EOS)
        assert torch.equal(a.response_mask, b.response_mask) and torch.equal(a.response_ids, b.response_ids)
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
        # ahead: the first call captures every (batch, context) pair, the second none; first_use: each call the pairs
        # it steps three times or more and has no graph of (the second call's seed gives another schedule)
        captured = graphed.last_call.graphs_captured
        if call == 0:
            assert captured > 3
        elif capture == "ahead":
            assert captured == 0
    assert graphed.last_call.smallest_bucket == 16 and graphed.last_call.prefills > 1
    state = next(iter(graphed._static.states.values()))
    sizes, windows = buckets(state.slots), contexts(state.cache_len, max(map(len, prompts)), 8)
    assert graphed._static.graphs_captured == len(state.graphs)  # the first call's and the second's
    if capture == "first_use":  # only the pairs the calls stepped
        assert len(state.graphs) < len(sizes) * len(windows), (len(state.graphs), sizes, windows)
    else:
        assert len(state.graphs) == len(sizes) * len(windows)
    assert graphed.last_call.mean_context < 0.8 * eager.last_call.mean_context
    graphed.sleep()  # a colocated engine between steps: memory given back, every graph captured again at wake
    graphed.wake()
    a = graphed.generate(prompts, n=3, max_new_tokens=30, temperature=1.0, eos_id=EOS)
    assert graphed.last_call.graphs_captured > 3 and graphed.last_call.capture_s > 0
    b = eager.generate(prompts, n=3, max_new_tokens=30, temperature=1.0, eos_id=EOS)
    assert torch.equal(a.response_ids, b.response_ids)
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
    graphed.sleep()  # no capture left underway: the allocator still empties its cache

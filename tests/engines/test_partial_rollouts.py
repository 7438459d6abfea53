"""Partial rollouts on the engine side: a weight sync from another thread enters a generation in flight between
decode steps (`rlfarm.engines.weight_gate`), and each token records the version of the weights whose logits it
was sampled from. Real tiny models on CPU, both decoders."""
import copy
import threading
import time

import pytest
import torch

from rlfarm.engines.hf import HFEngine
from rlfarm.engines.weight_gate import WeightGate
from rlfarm.models.lm import build_causal_lm

PAD = 0
TINY = {"model_type": "qwen2", "vocab_size": 40, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128}
PROMPTS = [[1, 5 + i % 30, 7, 9][: 2 + i % 3] for i in range(12)]
CAP, CHECK = 10, 2


def tiny_model(seed: int):
    torch.manual_seed(seed)
    return build_causal_lm(TINY).eval()


def engine_of(model, decoder: str) -> HFEngine:
    return HFEngine(copy.deepcopy(model), pad_id=PAD, seed=3, stop_check_every=CHECK, decoder=decoder,
                    max_batch=8 if decoder == "static" else None)


def sync_at_pause(engine: HFEngine, pause: int, state: dict, version: int) -> threading.Thread:
    """A weight sync in a thread of its own, asking for the gate just as the generation reaches its `pause`-th
    pause point (the decoder is held there until the sync asked, so the swap lands at that point exactly)."""
    asked, calls, original = threading.Event(), [0], engine._weights_now

    def weights_now():
        calls[0] += 1
        if calls[0] == pause:
            asked.set()
            while not engine.gate._waiting:
                time.sleep(0.001)
        return original()

    def sync():
        asked.wait()
        with engine.gate.swapping():
            engine.update_weights(state, version)

    engine._weights_now = weights_now
    thread = threading.Thread(target=sync)
    thread.start()
    return thread


@pytest.mark.parametrize("decoder", ["static", "hf"])
def test_weights_swapped_mid_generation_stamp_each_token_with_its_version(decoder):
    old, new = tiny_model(0), tiny_model(5)
    engine = engine_of(old, decoder)
    # pause 1 is before the first step, then one after every CHECK steps: pause 3 follows token 2·CHECK − 1
    thread = sync_at_pause(engine, 3, new.state_dict(), version=1)
    rollout = engine.generate(PROMPTS, n=2, max_new_tokens=CAP, temperature=1.0)
    thread.join(timeout=10)
    assert not thread.is_alive() and engine.weight_version == 1
    before = engine_of(old, decoder).generate(PROMPTS, n=2, max_new_tokens=CAP, temperature=1.0)
    after = engine_of(new, decoder).generate(PROMPTS, n=2, max_new_tokens=CAP, temperature=1.0)

    versions = rollout.token_versions
    assert versions.shape == rollout.response_ids.shape == (24, CAP) and rollout.weight_version == 0
    # the first rows (all 24 on the HF-cache path; the first 8 slots' samples on the static one) were in flight:
    # the first 2·CHECK tokens come from logits of the old weights, the rest from the new ones — except that the
    # static decoder pauses after a step's forward, so the token sampled right after the swap is from logits the
    # old weights computed; the HF-cache loop pauses before the forward
    in_flight = 8 if decoder == "static" else 24
    swapped_at = 2 * CHECK + (1 if decoder == "static" else 0)
    expected = torch.tensor([0] * swapped_at + [1] * (CAP - swapped_at))
    assert torch.equal(versions[:in_flight], expected.expand(in_flight, CAP))
    old_part = (slice(0, in_flight), slice(0, swapped_at))
    assert torch.equal(rollout.response_ids[old_part], before.response_ids[old_part])  # same noise, same weights
    torch.testing.assert_close(rollout.logprobs[old_part], before.logprobs[old_part], atol=1e-5, rtol=0)
    assert not torch.equal(rollout.response_ids[:in_flight], before.response_ids[:in_flight])  # then it changed
    if decoder == "static":  # samples that took a slot after the swap are the new weights' own, whole
        assert (versions[in_flight:] == 1).all()
        assert torch.equal(rollout.response_ids[in_flight:], after.response_ids[in_flight:])
        torch.testing.assert_close(rollout.logprobs[in_flight:], after.logprobs[in_flight:], atol=1e-5, rtol=0)


def test_the_gate_lets_a_sync_through_at_once_outside_a_generation_and_only_at_pauses_inside_one():
    gate, order = WeightGate(), []
    with gate.swapping():  # no generation: no wait
        order.append("swap 1")
    assert not gate.pause_point()  # nobody waits: a pause costs nothing

    def sync():
        with gate.swapping():
            order.append("swap 2")

    with gate.generating():
        thread = threading.Thread(target=sync)
        thread.start()
        while not gate._waiting:
            time.sleep(0.001)
        order.append("step")  # the sync waits while steps run
        assert gate.pause_point()  # ... and goes through here
        order.append("step after the pause")
    thread.join(timeout=10)
    assert order == ["swap 1", "step", "swap 2", "step after the pause"]

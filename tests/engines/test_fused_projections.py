"""q/k/v (and gate/up) as one GEMM in the static decoder (`rlfarm.engines.fused_projections`): the same samples as a
GEMM per module, and the modules' parameters really are views of the fused buffers — weights synced into them in
place, through the engine's receive path, are what the fused GEMM reads. Tiny real Llama-family models on CPU; on
CUDA the graphed and compiled step fused against unfused, and their step times side by side."""
import copy
import time

import pytest
import torch

from test_static_decoder import EOS, PAD, PROMPTS, TINY, tiny_model

from rlfarm.engines.base import load_into
from rlfarm.engines.hf import HFEngine
from rlfarm.models.lm import build_causal_lm, causal_lm, sequence_logprobs, trainable_state_dict
from rlfarm.sync.object_store import ObjectStoreReceiver, ObjectStoreSender


def engine_of(model, fuse: bool = True, **options) -> HFEngine:
    return HFEngine(copy.deepcopy(model), pad_id=PAD, seed=3, stop_check_every=1, fuse_projections=fuse, **options)


def generate(engine: HFEngine, temperature: float = 1.0, n: int = 3):
    return engine.generate(PROMPTS, n=n, max_new_tokens=9, temperature=temperature, eos_id=EOS)


def assert_same_samples(a, b) -> None:
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)


def aliased(engine: HFEngine) -> bool:
    """Every fused group's buffers hold its modules' parameters as their row blocks, at their addresses."""
    groups = engine._static.projections.groups()
    return bool(groups) and all(fused.intact() for fused in groups)


@pytest.mark.parametrize("model_type", ["qwen2", "llama", "qwen3"])  # qwen2: q/k/v biases; qwen3: q/k norms
def test_fused_projections_sample_what_a_gemm_per_module_samples(model_type):
    model = tiny_model(model_type)
    fused, plain = engine_of(model), engine_of(model, fuse=False)
    projections = fused._static.projections
    assert all(projections.qkv) and all(projections.gate_up) and aliased(fused)
    assert (projections.qkv[0].bias is not None) == (model_type == "qwen2")
    assert not plain._static.projections.groups()
    attention = fused.model.model.layers[0].self_attn
    assert attention.k_proj.weight.data_ptr() == projections.qkv[0].weight[attention.q_proj.out_features:].data_ptr()
    for temperature in (0.8, 0.0):
        assert_same_samples(generate(fused, temperature), generate(plain, temperature))
    # the learner (the model's own forward, projections per module) scores the fused engine's samples alike
    rollout = generate(fused)
    with torch.no_grad():
        learner = sequence_logprobs(model, rollout.input_ids(), rollout.attention_mask(), rollout.prompt_ids.shape[1],
                                    temperature=rollout.temperature)
    mask = rollout.response_mask.bool()
    assert (learner[mask] - rollout.logprobs[mask]).abs().max().item() < 1e-4


def test_weights_synced_in_place_reach_the_fused_buffers():
    # the engine's receive path (`load_into`, as EngineRole.receive_weights on CPU: object-store host copies) writes
    # the parameters in place; the fused GEMM reads them only if the parameters are views of its buffers
    old, new = tiny_model(seed=0), tiny_model(seed=7)
    engine = engine_of(old)
    buffers = [fused.weight.data_ptr() for fused in engine._static.projections.groups()]
    generate(engine)  # a call before the sync: its cache and steps exist when the weights change under them
    load_into(engine, ObjectStoreReceiver(), ObjectStoreSender().send(trainable_state_dict(new)), version=4)
    assert [fused.weight.data_ptr() for fused in engine._static.projections.groups()] == buffers  # not re-fused
    attention = new.model.layers[1].self_attn
    torch.testing.assert_close(engine._static.projections.qkv[1].bias,
                               torch.cat([attention.q_proj.bias, attention.k_proj.bias, attention.v_proj.bias]))
    engine.reseed(3)
    rollout = generate(engine)
    assert rollout.weight_version == 4
    assert_same_samples(rollout, generate(engine_of(new)))
    assert_same_samples(rollout, generate(engine_of(new, fuse=False)))


def test_a_sleep_that_drops_the_weights_fuses_again_over_what_the_next_sync_brings():
    # sleep moves every parameter to new storage (the colocated engine's weights leave the GPU): the decoder lets go
    # of its buffers, and its next call fuses again — over the weights the sync after the wake wrote
    learner = tiny_model(seed=5)
    engine = engine_of(tiny_model(seed=0))
    generate(engine)
    engine.sleep(discard=trainable_state_dict(engine.model).keys())
    assert all(fused.weight is None for fused in engine._static.projections.groups())
    engine.wake()
    load_into(engine, ObjectStoreReceiver(), ObjectStoreSender().send(trainable_state_dict(learner)), version=1)
    assert not aliased(engine)
    engine.reseed(3)
    assert_same_samples(generate(engine), generate(engine_of(learner)))
    assert aliased(engine)
    # and weights synced after that reach the new buffers
    other = tiny_model(seed=11)
    engine.update_weights(trainable_state_dict(other), version=2)
    engine.reseed(3)
    assert_same_samples(generate(engine), generate(engine_of(other)))


def test_two_engines_over_one_model_share_its_fused_buffers():
    # a second decoder over the same model (the bench's engines) finds the parameters already blocks of one buffer:
    # it reads that buffer, neither copies nor moves them again (the first one's graphs would read stale weights)
    model = tiny_model()
    first = HFEngine(model, pad_id=PAD)
    second = HFEngine(model, pad_id=PAD, fuse_projections=True)
    assert [f.weight.data_ptr() for f in first._static.projections.groups()] == \
        [f.weight.data_ptr() for f in second._static.projections.groups()]
    copied = HFEngine(copy.deepcopy(model), pad_id=PAD)
    assert aliased(copied) and aliased(first)
    assert_same_samples(generate(first), generate(copied))


def test_switching_fusion_on_one_engine_keys_its_steps_apart():
    model = tiny_model()
    engine, plain = engine_of(model), engine_of(model, fuse=False)
    engine._static.projections.switch(False)
    assert not engine._static.projections.groups()
    assert_same_samples(generate(engine), generate(plain))
    engine._static.projections.switch(True)
    assert aliased(engine)
    engine.reseed(3)
    plain.reseed(3)
    assert_same_samples(generate(engine), generate(plain))


def test_lora_adapted_projections_run_their_own_forwards_and_the_rest_is_fused():
    # peft's LoRA layers are not plain Linears: adapted q/k/v keep a GEMM per module (adapters included), the
    # unadapted MLP's gate/up still fuse; adapters synced later reach the engine either way
    torch.manual_seed(0)
    model = causal_lm({**TINY, "model_type": "qwen2"},
                      lora={"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]})
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.3)
    model.eval()
    fused, plain = engine_of(model), engine_of(model, fuse=False)
    projections = fused._static.projections
    assert not any(projections.qkv) and all(projections.gate_up)
    assert_same_samples(generate(fused), generate(plain))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_A" in name:
                param.add_(0.2)
    adapters = trainable_state_dict(model)
    assert adapters and all("lora_" in name for name in adapters)
    for engine in (fused, plain):
        load_into(engine, ObjectStoreReceiver(), ObjectStoreSender().send(adapters), version=1)
        engine.reseed(3)
    rollout = generate(fused)
    assert_same_samples(rollout, generate(plain))
    with torch.no_grad():
        learner = sequence_logprobs(model, rollout.input_ids(), rollout.attention_mask(), rollout.prompt_ids.shape[1],
                                    temperature=rollout.temperature)
    mask = rollout.response_mask.bool()
    assert (learner[mask] - rollout.logprobs[mask]).abs().max().item() < 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("compile", [False, True])
def test_cuda_graphed_fused_steps_equal_unfused_ones_and_follow_in_place_syncs(compile):
    model = tiny_model("qwen2", vocab_size=1000, num_hidden_layers=3).cuda()
    fused = HFEngine(copy.deepcopy(model), pad_id=PAD, device="cuda", seed=5, compile=compile)
    plain = HFEngine(copy.deepcopy(model), pad_id=PAD, device="cuda", seed=5, compile=compile, fuse_projections=False)
    prompts = [[1 + (i * 7 + j) % 900 for j in range(5 + i % 4)] for i in range(6)]
    for _ in range(2):  # the second call replays the captured graphs
        a = fused.generate(prompts, n=4, max_new_tokens=20, temperature=1.0, eos_id=EOS)
        b = plain.generate(prompts, n=4, max_new_tokens=20, temperature=1.0, eos_id=EOS)
        assert torch.equal(a.response_ids, b.response_ids)
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-4, rtol=0)
    other = tiny_model("qwen2", seed=9, vocab_size=1000, num_hidden_layers=3)
    fused.update_weights(dict(other.named_parameters()), version=1)  # into the captured graphs' buffers
    expected = HFEngine(other.cuda(), pad_id=PAD, device="cuda", cuda_graphs=False, fuse_projections=False)
    assert torch.equal(fused.generate(prompts, n=1, max_new_tokens=6, temperature=0.0).response_ids,
                       expected.generate(prompts, n=1, max_new_tokens=6, temperature=0.0).response_ids)


@pytest.mark.gpu
def test_cuda_fused_decode_step_is_not_slower_than_a_gemm_per_module():
    # a small GQA shape in bf16 (Qwen2.5-0.5B's layer, 8 layers), 128 rows, graphed and compiled: each step time is
    # the median of three calls' (full − one-token) time over the steps
    shape = {"model_type": "qwen2", "vocab_size": 32000, "hidden_size": 896, "intermediate_size": 4864,
             "num_hidden_layers": 8, "num_attention_heads": 14, "num_key_value_heads": 2,
             "max_position_embeddings": 2048}
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = build_causal_lm(shape).to(torch.bfloat16).eval()
    prompts = torch.randint(1, 32000, (128, 64), generator=torch.Generator().manual_seed(0)).tolist()
    times = {}
    for fuse in (True, False):
        engine = HFEngine(model, pad_id=PAD, device="cuda", seed=0, fuse_projections=fuse)  # unfused: per module
        engine.prepare(128, 1, 64, 256)
        engine.prepare(128, 1, 64, 1)
        engine.generate(prompts, 1, 256)

        def seconds(steps: int) -> float:
            torch.cuda.synchronize()
            started = time.perf_counter()
            engine.generate(prompts, 1, steps)
            torch.cuda.synchronize()
            return time.perf_counter() - started

        times[fuse] = sorted(1e3 * (seconds(256) - seconds(1)) / 255 for _ in range(3))[1]
    print(f"decode step ms: fused {times[True]:.3f}, per module {times[False]:.3f}")
    assert times[True] <= 1.05 * times[False], times

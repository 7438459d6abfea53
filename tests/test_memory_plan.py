"""The GPU memory estimate of an LLM run (issue 37: a layout that cannot fit is refused in one line at start-up,
not by an OOM traceback; `rlfarm plan` shows each GPU's peak): its shape arithmetic against real models, the
colocated peak, and the refusal on a real composed config and planned topology."""
import pytest

from rlfarm.config import compose
from rlfarm.errors import ConfigError
from rlfarm.families import LLM
from rlfarm.loops import llm_memory
from rlfarm.memory_plan import GIB, engine_bytes, gpu_peaks, learner_bytes, lm_shape
from rlfarm.models.lm import build_causal_lm
from rlfarm.topology import plan_topology

QWEN = {"model_type": "qwen2", "vocab_size": 50, "hidden_size": 16, "intermediate_size": 40, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2}


@pytest.mark.parametrize("tied", [True, False])
def test_the_shape_counts_the_parameters_the_model_has(tied):
    config = {**QWEN, "tie_word_embeddings": tied}
    model = build_causal_lm(config)
    assert lm_shape(config).params == sum(p.numel() for p in model.parameters())


def test_learner_state_is_16_bytes_a_parameter_sharded_and_lora_keeps_4_for_the_frozen_base():
    shape = lm_shape({**QWEN, "vocab_size": 1000})
    one = learner_bytes(shape, ranks=1, fsdp=False, tokens=100)
    assert one["state"] == 16 * shape.params and one["gathered"] == 0
    assert one["logits"] == 3 * 4 * 100 * 1000  # under the chunk budget: the whole response's logits
    fsdp = learner_bytes(shape, ranks=4, fsdp=True, tokens=100)
    assert fsdp["state"] == 16 * shape.params / 4  # two bf16 blocks, the root's fp32 gradients:
    assert fsdp["gathered"] == 4 * shape.block_params + 4 * (shape.params - 3 * shape.block_params)
    assert learner_bytes(shape, ranks=1, fsdp=False, tokens=100, lora_params=10)["state"] == 4 * shape.params + 160
    big = learner_bytes(lm_shape({**QWEN, "vocab_size": 152_064}), ranks=1, fsdp=False, tokens=16 * 1024)
    assert big["logits"] == 3 * 4 * (1 << 26)  # the head in chunks: never the whole [tokens, vocab]


def test_packed_pieces_and_compiled_blocks_keep_fewer_activation_bytes_a_token_than_padded_rows():
    """Calibrated on 2× H200 at the 7B shape: packed eager 61 B, packed compiled 43–46 B per hidden unit, token and
    layer, with ~15 % to spare (the padded eager rows' 86 B came from the 1.5B shape); compile is counted only where
    it was measured."""
    shape = lm_shape(QWEN)
    activations = {(packed, compiled): learner_bytes(shape, ranks=1, fsdp=False, tokens=100, packed=packed,
                                                     compiled=compiled)["activations"]
                   for packed in (False, True) for compiled in (False, True)}
    per_token = {key: value / (shape.hidden * 100 * shape.layers) for key, value in activations.items()}
    assert per_token == {(False, False): 88, (False, True): 88, (True, False): 72, (True, True): 52}
    recomputed = learner_bytes(shape, ranks=1, fsdp=False, tokens=100, recompute=True, packed=True, compiled=True)
    assert recomputed["activations"] == (4 * shape.layers + 52) * shape.hidden * 100  # one block's, at the packed rate


def test_a_colocated_gpu_peaks_at_the_larger_phase_its_engines_release_the_cache_to_train():
    shape = lm_shape(QWEN)
    learner = {"state": 10.0, "activations": 4.0, "autocast": 1.0, "logits": 1.0, "gathered": 0.0}
    engine = {"weights": 3.0, "kv_cache": 4.0, "logits": 0.5}
    peaks = gpu_peaks([("learner", "a", learner), ("engine", "a", engine), ("engine", "b", engine)])
    assert peaks == {"a": max(10 + 3 + 4 + 0.5, 10 + 3 + 5 + 1), "b": 7.5}
    cache = engine_bytes(shape, slots=8, cache_tokens=100, dtype_bytes=2)["kv_cache"]
    assert cache == 8 * 100 * 3 * 2 * 2 * 4 * 2  # slots × tokens × layers × (k, v) × kv heads × head dim × bf16


def test_a_7b_learner_on_one_card_is_refused_in_one_line_and_the_check_can_be_skipped(monkeypatch):
    args = ["experiment=grpo_long_tail", "model=qwen2_5_7b_shape"]
    cfg = compose("train", args)
    plan = plan_topology(cfg.topology, LLM)
    monkeypatch.setattr(llm_memory, "visible_card_bytes", lambda: 141.0 * GIB)  # an H200's
    with pytest.raises(ConfigError) as refused:
        LLM.check_plan(cfg, plan)
    line = str(refused.value)
    assert "GPU 0 of pool 'shared' would need ~" in line and "141 GiB card" in line and "\n" not in line
    assert "algo.data_parallel=fsdp" in line and "run.memory_check=false" in line
    LLM.check_plan(compose("train", [*args, "run.memory_check=false"]), plan)  # skipped: no error
    LLM.check_plan(compose("train", ["experiment=grpo_long_tail"]), plan)  # the 1.5B shape fits
    lines = LLM.memory_lines(cfg, plan)
    assert lines[1].startswith("  learner (each of 1): ") and "state 113.5" in lines[1]  # 7.6B params × 16 B
    assert lines[-1].startswith("  GPU 0 of pool shared: peak ") and "DOES NOT FIT" in lines[-1]
    monkeypatch.setattr(llm_memory, "visible_card_bytes", lambda: None)  # a CPU driver: nothing to check against
    LLM.check_plan(cfg, plan)


def test_a_shape_keeps_its_own_vocabulary_only_when_asked_and_a_wrong_choice_is_one_line():
    from rlfarm.envs.text_tasks import DigitTokenizer
    from rlfarm.loops.llm import grpo_config

    shape = compose("train", ["experiment=grpo_long_tail"])  # model.vocab=shape: the head's real cost
    assert grpo_config(shape).vocab_size == 151_936 == llm_memory.model_shape(shape).vocab
    task = compose("train", ["experiment=grpo_long_tail", "model.vocab=task"])
    assert grpo_config(task).vocab_size is None and llm_memory.model_shape(task).vocab == DigitTokenizer().vocab_size
    with pytest.raises(ConfigError, match="model.vocab must be task or shape, got 'all'"):
        grpo_config(compose("train", ["experiment=grpo_long_tail", "model.vocab=all"]))
    assert DigitTokenizer().decode([1, 5, 20_000, 2]) == "^2?$"  # a sampled id past the tokenizer's 15


def test_the_7b_experiment_plans_to_fit_two_and_four_h200s(monkeypatch):
    """experiment=grpo_7b_shape: FSDP ranks, compiled blocks without recomputation, 8k-token packed pieces, the head
    in chunks (measured on 2× H200 at 113 GiB on rank 0: the estimate must let it run there)."""
    monkeypatch.setattr(llm_memory, "visible_card_bytes", lambda: 141.0 * GIB)
    for topology, gpus in (("colocated_2", 2), ("colocated_4", 4), ("split_2_2", 4)):
        cfg = compose("train", ["experiment=grpo_7b_shape", f"topology={topology}"])
        plan = plan_topology(cfg.topology, LLM)
        LLM.check_plan(cfg, plan)  # no error: it fits
        lines = LLM.memory_lines(cfg, plan)
        assert sum(line.startswith("  GPU ") for line in lines) == gpus, lines

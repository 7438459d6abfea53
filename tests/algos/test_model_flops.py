"""The learner's model-FLOPs utilization (issue 37): 6·N·T over the time and the cards' peak, N the matrix
parameters (an untied input embedding left out), 4·N·T under LoRA; on a CPU (no peak) only TFLOP/s."""
import pytest

from rlfarm.algos.model_flops import UpdateFigures, matrix_params
from rlfarm.models.lm import causal_lm
from rlfarm.telemetry.summary import _learner_work

TINY = {"model_type": "qwen2", "vocab_size": 50, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2}


def test_matrix_parameters_leave_out_an_untied_input_embedding_and_norms():
    # per layer: q, o 16×16; k, v 8×16 (2 kv heads of 4); gate, up, down 32×16; the head 50×16
    per_layer = 2 * 16 * 16 + 2 * 8 * 16 + 3 * 32 * 16
    untied = causal_lm({**TINY, "tie_word_embeddings": False})
    tied = causal_lm({**TINY, "tie_word_embeddings": True})
    assert matrix_params(untied) == 2 * per_layer + 50 * 16  # the embedding is a lookup
    assert matrix_params(tied) == 2 * per_layer + 50 * 16    # one matrix, used as the head


def test_mfu_is_six_n_t_over_time_and_the_ranks_peak_and_lora_counts_four():
    model = causal_lm({**TINY, "tie_word_embeddings": False})
    n = matrix_params(model)
    two_cards = UpdateFigures(model, "cpu", world_size=2, peak_tflops=1e-6)  # a peak of 1 MFLOP/s a card
    figures = two_cards.of(tokens=1000, seconds=2.0)
    assert figures["learner_tflops"] == pytest.approx(6 * n * 1000 / 2.0 / 1e12)
    assert figures["mfu"] == pytest.approx(6 * n * 1000 / 2.0 / 2e6)
    lora = causal_lm({**TINY, "tie_word_embeddings": False}, lora={"r": 2, "alpha": 4, "target_modules": ["q_proj"]})
    assert UpdateFigures(lora, "cpu").flops_per_token == 4 * matrix_params(lora)  # the frozen base's weight grads skipped
    on_cpu = UpdateFigures(model, "cpu").of(tokens=1000, seconds=2.0)
    assert on_cpu["mfu"] is None and on_cpu["learner_peak_gib"] is None and on_cpu["learner_tflops"] > 0  # no card
    assert _learner_work({"learner_tflops": 0.00123}) == " Learner 0.00123 TFLOP/s of model FLOPs (6·N·T)."
    line = _learner_work({"learner_tflops": 410.0, "mfu": 0.415, "learner_peak_gib": 61.2})
    assert "MFU 41.5 % of the cards' dense bf16 peak, 61.2 GiB at most on its GPU" in line


def test_an_update_reports_the_graphs_compiled_during_it_and_no_allocator_retries_on_a_cpu(one_torch_thread):
    """A slow update's causes told apart (issue 37): learner_compiles counts dynamo's graphs since the last update
    (a compiled block's first forward makes some; the same shapes again make none)."""
    import torch

    torch._dynamo.reset()
    figures = UpdateFigures(causal_lm({**TINY, "tie_word_embeddings": False}), "cpu")
    double = torch.compile(lambda x: x * 2 + 1, backend="eager")
    double(torch.ones(3))
    first = figures.of(tokens=10, seconds=1.0)
    double(torch.ones(3))
    second = figures.of(tokens=10, seconds=1.0)
    torch._dynamo.reset()
    assert first["learner_compiles"] >= 1 and second["learner_compiles"] == 0
    assert first["learner_alloc_retries"] is None  # no CUDA allocator on a CPU

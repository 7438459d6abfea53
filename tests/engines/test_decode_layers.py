"""The decode step's layer pieces (`rlfarm.engines.decode_layers`) compile once for all layers when the step's own
graph breaks inside its layer loop, as it does on CUDA around the per-row attention kernel (here: the matmul
attention made opaque to dynamo the same way), and the step samples what the eager engine samples; where Triton
runs on the CPU (TRITON_INTERPRET=1), the compiled kernel path itself against the eager matmul path."""
import copy
import os

import pytest
import torch
from torch._dynamo.utils import counters

from rlfarm.engines import static_decoder
from rlfarm.engines.decode_attention import available
from rlfarm.engines.hf import HFEngine
from test_static_decoder import EOS, PAD, tiny_model

LAYERS = 12  # more than dynamo's recompile_limit (8): a piece compiled per layer index would run eagerly past it


def test_a_step_that_breaks_in_its_layer_loop_compiles_each_piece_once_for_all_layers(monkeypatch, one_torch_thread):
    monkeypatch.setattr(static_decoder, "attend_cache", torch.compiler.disable(static_decoder.attend_cache))
    model = tiny_model("qwen2", vocab_size=200, num_hidden_layers=LAYERS)
    compiled = HFEngine(copy.deepcopy(model), pad_id=PAD, seed=5, compile=True)
    decoder = compiled._static  # dynamo's backend "eager": its frames, guards and recompiles, without inductor's build
    decoder._sample_fn = torch.compile(decoder._sample_and_record, backend="eager")
    decoder._forward_fn = torch.compile(decoder._forward_next, backend="eager")
    eager = HFEngine(copy.deepcopy(model), pad_id=PAD, seed=5)
    prompts = [[1 + (i * 7 + j) % 190 for j in range(3 + i % 4)] for i in range(4)]
    torch._dynamo.reset()
    counters.clear()
    a = compiled.generate(prompts, n=2, max_new_tokens=6, temperature=1.0, eos_id=EOS)
    b = eager.generate(prompts, n=2, max_new_tokens=6, temperature=1.0, eos_id=EOS)
    assert torch.equal(a.response_ids, b.response_ids)
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
    # the sampling step, enter, open_layer, between, finish_layer, close: each once (a piece keyed by a
    # layer index compiled up to recompile_limit times, then left the rest of the layers eager)
    assert counters["stats"]["unique_graphs"] <= 8, dict(counters["stats"])
    assert not any("recompile_limit" in str(key) for key in counters["graph_break"]), dict(counters["graph_break"])


INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1" and available(torch.device("cpu"))


@pytest.mark.skipif(not INTERPRETED, reason="the per-row kernel on a CPU: Triton installed and TRITON_INTERPRET=1 "
                                            "(CI's torch has no Triton; on CUDA the graphed tests in "
                                            "test_static_decoder.py cover this path)")
def test_the_compiled_kernel_path_writes_the_cache_in_its_pieces_and_samples_what_eager_matmuls_sample():
    # inductor's own kernels (C++ here) around the per-row kernel, refill through buckets with context buckets:
    # the cache write inside the compiled pieces must land where the kernel reads it
    model = tiny_model("qwen2", vocab_size=1000, num_hidden_layers=3)
    lengths = {"median_frac": 0.2, "p99_frac": 1.0}
    compiled = HFEngine(copy.deepcopy(model), pad_id=PAD, seed=5, max_batch=8, synthetic_lengths=lengths, compile=True)
    eager = HFEngine(copy.deepcopy(model), pad_id=PAD, seed=5, synthetic_lengths=lengths)
    compiled._static.attention, compiled._static.context_step = "rows", 8
    eager._static.attention, eager._static.context_step = "matmul", None
    prompts = [[1 + (i * 7 + j) % 900 for j in range(5 + i % 4)] for i in range(6)]
    a = compiled.generate(prompts, n=2, max_new_tokens=20, temperature=1.0, eos_id=EOS)
    b = eager.generate(prompts, n=2, max_new_tokens=20, temperature=1.0, eos_id=EOS)
    assert torch.equal(a.response_ids, b.response_ids)
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
    assert compiled.last_call.prefills > 1  # rows were refilled

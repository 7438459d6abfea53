"""The decode step's layer pieces (`rlfarm.engines.decode_layers`) compile once for all layers when the step's own
graph breaks inside its layer loop, as it does on CUDA around the per-row attention kernel (here: the matmul
attention made opaque to dynamo the same way), and the step samples what the eager engine samples."""
import copy

import torch
from torch._dynamo.utils import counters

from rlfarm.engines import static_decoder
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

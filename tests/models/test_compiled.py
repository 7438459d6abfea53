"""Regional compilation (`algo.compile_layers`, issue 37): each decoder block torch.compiled, the eager values and
gradients, padded and packed, with and without recomputed blocks, under DDP and FSDP; one graph per block, no graph
break, no recompilation per piece length. On CPU the backend is aot_eager (`rlfarm.models.compiled`): dynamo and
AOTAutograd capture and split the graphs inductor gets on a GPU, run with eager kernels (no C++ toolchain, seconds);
inductor's kernels, and varlen flash attention run inside them, are the GPU's to check."""
import copy

import pytest
import torch
from torch._dynamo.utils import counters

from rlfarm.models.compiled import compile_layers, is_compiled
from rlfarm.models.lm import causal_lm, decoder_blocks, sequence_logprobs
from rlfarm.models.packed import packed_logprobs
from test_packed import QWEN2, _rows

CHECKPOINT = "tag_activation_checkpoint"  # the higher-order op a traced torch.utils.checkpoint becomes


@pytest.fixture(autouse=True)
def fresh_dynamo(one_torch_thread):
    """Dynamo's caches and counters are the process's: each test starts from none."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def recording(graphs: list, backend: str = "aot_eager"):
    """`backend` (aot_eager: the CPU default), keeping each graph dynamo hands it."""
    from torch._dynamo.backends.registry import lookup_backend

    def compile_graph(graph, example_inputs):
        graphs.append(graph)
        return lookup_backend(backend)(graph, example_inputs)
    return compile_graph


def _scored(model, score, ids, mask, weights):
    model.zero_grad()
    logprobs = score(model, ids, mask, 6, 0.9, logit_budget=4 * 23)  # the head in chunks, as a 7B step
    (logprobs * weights).sum().backward()
    return logprobs.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("recompute", [False, True], ids=["kept", "recomputed"])
@pytest.mark.parametrize("score", [sequence_logprobs, packed_logprobs], ids=["padded", "packed"])
def test_compiled_blocks_give_the_eager_logprobs_and_gradients(score, recompute):
    torch.manual_seed(0)
    eager = causal_lm(QWEN2, recompute=recompute).train()
    compiled, graphs = copy.deepcopy(eager), []
    assert compile_layers(compiled, "cpu", backend=recording(graphs)) == 2
    assert compile_layers(compiled, "cpu") == 0 and all(map(is_compiled, decoder_blocks(compiled)))  # once
    ids, mask = _rows()
    weights = torch.arange(1.0, 8.0) * mask[:, 6:]
    (expected, expected_grads), (logprobs, grads) = (_scored(m, score, ids, mask, weights) for m in (eager, compiled))
    torch.testing.assert_close(logprobs, expected, atol=1e-6, rtol=0)
    for name, grad in expected_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-6, rtol=1e-5, msg=name)
    # one graph for both blocks (they share their code), nothing left out of it, the checkpoint traced into it
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    assert (CHECKPOINT in str(graphs[-1].graph)) == recompute
    assert not any(map(is_compiled, decoder_blocks(eager)))


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp"])
def test_blocks_compiled_inside_ddp_and_fsdp_with_recomputed_blocks_keep_the_gradients(wrapper, wrapped_policy):
    """Compiled after the wrapping (the learner's order: FSDP2's hooks stay outside the compiled code), the packed
    pieces' gradients are the plain padded model's, the blocks recomputed in the compiled graph. One rank over gloo."""
    from rlfarm.data_parallel import full_tensors

    plain, model, wrapped = wrapped_policy(QWEN2, wrapper)
    graphs = []
    assert compile_layers(wrapped, "cpu", backend=recording(graphs)) == 2  # through DDP, and FSDP's block subclasses
    ids, mask = _rows()
    weights = torch.arange(1.0, 8.0) * mask[:, 6:]
    (sequence_logprobs(plain, ids, mask, 6) * weights).sum().backward()
    for _ in range(2):  # twice: the second runs on what the first compiled, FSDP's parameters gathered again
        model.zero_grad()
        (packed_logprobs(wrapped, ids, mask, 6, logit_budget=4 * 23) * weights).sum().backward()
    grads = full_tensors({name: p.grad for name, p in model.named_parameters()})
    for name, p in plain.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, atol=1e-6, rtol=1e-5, msg=name)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    assert CHECKPOINT in str(graphs[-1].graph)


def test_blocks_compiled_before_fully_shard_are_refused(wrapped_policy):
    """FSDP2 gives a sharded block a subclass whose forward transformers wraps again: a forward compiled before
    would skip the recomputation, silently. `shard_model` says so instead."""
    from rlfarm.data_parallel import shard_model

    model = causal_lm(QWEN2, recompute=True)
    compile_layers(model, "cpu")
    with pytest.raises(RuntimeError, match="after shard_model"):
        shard_model(model)


def _piece(rows: list[int], cut: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Some rows of `_rows`, their responses cut to `cut` columns: a piece of another length and row count."""
    ids, mask = _rows(seed=seed)
    return ids[rows, :6 + cut], mask[rows, :6 + cut]


@pytest.mark.parametrize("score", [sequence_logprobs, packed_logprobs], ids=["padded", "packed"])
def test_pieces_of_new_lengths_and_row_counts_compile_nothing_new(score):
    """Dynamic token and row dimensions: after the first piece (with gradients, and without: the TIS pre-pass), pieces
    of other lengths, widths and row counts run on the graphs compiled — a recompile raises here. The first piece
    makes three: with gradients; without, the first block apart (transformers makes the embeddings' output require
    gradients for checkpointed blocks, even under no_grad). A run is padded or packed throughout (the packed
    attention is the model's from its first packed forward on): one model each here."""
    torch.manual_seed(0)
    model = causal_lm(QWEN2, recompute=True).train()
    compile_layers(model, "cpu")

    def step(ids, mask):
        with torch.no_grad():
            score(model, ids, mask, 6)
        score(model, ids, mask, 6).sum().backward()

    step(*_piece([0, 1, 2, 3, 4], 7, seed=0))
    first = counters["stats"]["unique_graphs"]
    assert first <= 3 and not counters["graph_break"]
    with torch._dynamo.config.patch(error_on_recompile=True):
        for seed, (rows, cut) in enumerate([([0, 2], 4), ([1, 3, 4], 6), ([0, 3, 4, 2], 3), ([3, 0], 7),
                                            ([4, 2, 0], 5)], start=1):
            step(*_piece(rows, cut, seed))
    assert counters["stats"]["unique_graphs"] == first and not counters["graph_break"]


def test_the_varlen_attention_call_traces_into_one_graph():
    """The CUDA path's attention (`packed._varlen` → torch's `varlen_attn`, a custom op with a fake implementation)
    traced whole (fullgraph: a break raises). Flash attention has no CPU kernel, so only the tracing runs here: the
    backend keeps the graph and returns zeros of its output's shape."""
    from rlfarm.models import packed

    if packed.varlen_attn is None:
        pytest.skip(f"torch {torch.__version__} has no torch.nn.attention.varlen")
    graphs = []

    def tracing_only(graph, example_inputs):
        graphs.append(graph)
        outputs = graph.graph.find_nodes(op="output")[0].args[0]
        return lambda *args: tuple(torch.zeros(tuple(map(int, node.meta["example_value"].shape))) for node in outputs)

    query, key, value = torch.randn(1, 4, 11, 8), torch.randn(1, 2, 11, 8), torch.randn(1, 2, 11, 8)  # grouped K/V
    bounds = torch.tensor([0, 5, 11], dtype=torch.int32)
    traced = torch.compile(packed._varlen, backend=tracing_only, fullgraph=True)
    assert traced(torch.nn.Identity(), query, key, value, bounds, 6, 8 ** -0.5).shape == (1, 11, 4, 8)
    assert "torch_attn._varlen_attn" in str(graphs[-1].graph) and counters["stats"]["unique_graphs"] == 1


@pytest.mark.gpu
def test_on_cuda_inductor_compiles_the_packed_blocks_with_varlen_flash_inside():
    """The GPU's path: inductor's kernels, bf16 autocast over fp32 weights (the learner's), varlen flash attention in
    the graph, recomputed blocks; the eager packed path's log-probs and gradients within bf16 noise (fused kernels
    round differently), one graph for all blocks, and a piece of another length compiles nothing new."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    config = {**QWEN2, "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 8,
              "num_key_value_heads": 2, "max_position_embeddings": 256}
    torch.manual_seed(0)
    eager = causal_lm(config, recompute=True).to("cuda").train()
    compiled, graphs = copy.deepcopy(eager), []
    compile_layers(compiled, "cuda", backend=recording(graphs, "inductor"))

    def piece(rows, cut, seed):
        ids, mask = (t.cuda() for t in _piece(rows, cut, seed))
        return ids * 20 % 512 * mask, mask, torch.arange(1.0, cut + 1, device="cuda") * mask[:, 6:]

    with torch.autocast("cuda", dtype=torch.bfloat16):
        ids, mask, weights = piece([0, 1, 2, 3, 4], 7, seed=0)
        (expected, expected_grads), (logprobs, grads) = (_scored(m, packed_logprobs, ids, mask, weights)
                                                         for m in (eager, compiled))
        with torch._dynamo.config.patch(error_on_recompile=True):
            _scored(compiled, packed_logprobs, *piece([1, 3, 4], 5, seed=1))
    response = mask[:, 6:].bool()
    torch.testing.assert_close(logprobs[response], expected[response], atol=0.05, rtol=0.02)
    for name, grad in expected_grads.items():
        cosine = torch.nn.functional.cosine_similarity(grads[name].flatten(), grad.flatten(), dim=0)
        assert cosine > 0.99, (name, float(cosine))
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    # With the checkpoint in the graph, the block's body (and its attention) is a nested graph of the checkpoint's.
    nested = [module for module in graphs[-1].modules() if isinstance(module, torch.fx.GraphModule)]
    graph_texts = " ".join(str(module.graph) for module in nested)
    assert "torch_attn._varlen_attn" in graph_texts and CHECKPOINT in str(graphs[-1].graph)

"""Regional compilation (`algo.compile_layers`, issue 37): each decoder block of the learner's policy torch.compiled.

What: a block (Qwen2DecoderLayer: two RMSNorms, the q/k/v/o and SwiGLU projections, rotary, attention, two residual
adds) becomes one graph, so the elementwise work between its matmuls (norms, rotary, SiLU × gate, residuals, casts)
fuses into a few kernels instead of dozens of eager ones, each reading and writing the activations. The blocks share
their code, so one compilation serves all of them (dynamo guards on a block's class, attributes and input shapes,
not on which block it is); the embeddings, the final norm and the head (`ScoringHead`, chunked) stay eager.

Shapes: the tokens of a forward change with every piece (token-budget pieces, packed sequences, rows of a piece), so
the blocks compile with `dynamic=True`: the token and row dimensions and the packed forward's `max_length_*` are
symbols from the first compilation on, and a new length reuses the graph (a static first graph would be compiled
again at the second length). Sizes the weights fix (hidden, heads, head_dim) are still specialized. What does add a
compilation: gradients off (the TIS pre-pass; there the first block apart, whose input transformers makes require
gradients for checkpointed blocks), padded pieces with or without a mask, a padded piece of one row (size 1 is
always specialized); a run is padded or packed throughout. A handful, under dynamo's `recompile_limit` (8 per
code; past it a block runs eagerly, with a warning), whatever the lengths (tests/models/test_compiled.py bounds them
over pieces of many lengths: a packed run with checkpointing makes 1 with gradients, 2 more without).

Order: as torchtitan's `apply_compile` nests them — FSDP2's hooks outermost and eager, the compiled block inside, the
activation checkpoint inside that, traced into the graph (the compiler recomputes the block in the backward pass).
Here the compiled function is the block's `forward`, set on the instance: under activation checkpointing that is
transformers' wrapper running the original forward under `torch.utils.checkpoint`, and `nn.Module.__call__` with its
hooks (FSDP2's all-gather and reshard, DDP's) runs around it. It is applied last, by `grpo_lm.update_policy` at its
first call (the learner's ranks wrapped the model when they joined), after `shard_model`: `fully_shard`
gives each block a subclass (FSDPQwen2DecoderLayer) whose forward transformers wraps again, and a forward bound
before that would skip the checkpoint (`shard_model` refuses a compiled block).
Before transformers 5.23 (the GPU machine has 5.17) the checkpoint sat in `GradientCheckpointingLayer.__call__`,
around `nn.Module.__call__`, so it stayed eager around the compiled forward (the GPU test found no checkpoint in the
graph); there the block's class gets `nn.Module.__call__` back and the compiled function is `_checkpointed`, what
5.23 wraps a forward in. Not `block.compile()`: that compiles `__call__`, FSDP2's hooks included; nor `torch.compile(block)` in its place: the wrapper module renames every
parameter (`_orig_mod.`), and weight sync and checkpoints go by name.

Attention: the packed forward's attention is traced with the rest (`rlfarm.models.packed`): on CUDA `varlen_attn` is
a custom op with a fake implementation (one node in the graph, no break), on CPU the block-diagonal mask is built
with a known size. No graph break is expected anywhere in a block (the tests count them).

Backend: inductor on CUDA (Triton kernels). Elsewhere aot_eager: dynamo and AOTAutograd capture and split the same
graphs (forward, backward, the checkpointed region) but run them with eager kernels, so CPU runs and CI need no C++
toolchain and compile in seconds; what inductor generates is only seen on a GPU.
"""
from __future__ import annotations

from functools import cache, partial

import torch
from torch import nn

from rlfarm.models.lm import base_model, decoder_blocks


def compile_backend(device: torch.device | str) -> str:
    """inductor on CUDA; aot_eager elsewhere (see the module's docstring)."""
    return "inductor" if torch.device(device).type == "cuda" else "aot_eager"


def compile_layers(model: nn.Module, device: torch.device | str, backend: str | None = None) -> int:
    """Compile each decoder block of `model` in place, once (a block compiled already is left as it is), after any
    `shard_model` / `wrap_data_parallel`. Compilation itself happens at the first forward. Returns the blocks
    compiled by this call."""
    blocks = decoder_blocks(model)
    if not blocks:
        raise ValueError(f"algo.compile_layers: {type(base_model(model)).__name__} names no decoder blocks "
                         f"(_no_split_modules); set algo.compile_layers=false")
    fresh = [block for block in blocks if not is_compiled(block)]
    if fresh:  # a compilation after the first update costs it ~4x (7B: 24 s against 5): the log says which guard failed
        torch._logging.set_logs(recompiles=True)
    for block in fresh:
        forward = block.forward
        if _checkpoints_in_call(block):  # transformers < 5.23: move the checkpoint inside the compiled forward
            block.__class__ = _plain_call(type(block))
            forward = partial(_checkpointed, block, forward)
        block.forward = torch.compile(forward, backend=backend or compile_backend(device), dynamic=True)
    return len(fresh)


def _checkpoints_in_call(block: nn.Module) -> bool:
    """transformers < 5.23 checkpoints a block in `GradientCheckpointingLayer.__call__`, around `nn.Module.__call__`
    (hooks and the compiled forward inside, the checkpoint eager); 5.23 on wraps the class's `forward` instead."""
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:
        return False
    return isinstance(block, GradientCheckpointingLayer) and "__call__" in vars(GradientCheckpointingLayer)


@cache
def _plain_call(cls: type) -> type:
    """`cls` with `nn.Module.__call__` back (its hooks only): the checkpoint moves into `_checkpointed`."""
    return type(cls.__name__, (cls,), {"__call__": nn.Module.__call__, "__module__": cls.__module__})


def _checkpointed(block: nn.Module, forward, *args, **kwargs):
    """What transformers >= 5.23 wraps a block's forward in (training use: no cache to drop)."""
    if block.gradient_checkpointing and block.training and torch.is_grad_enabled():
        return block._gradient_checkpointing_func(partial(forward, **kwargs), *args)
    return forward(*args, **kwargs)


def is_compiled(block: nn.Module) -> bool:
    return "forward" in vars(block)

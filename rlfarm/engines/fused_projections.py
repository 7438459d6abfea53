"""The projections of a Llama-family layer that read one input, run as one GEMM each (issue 35, item 3): the
attention's q, k and v (one weight [q_out + k_out + v_out, hidden] and, where the layer has them — Qwen2 — one
bias), and the MLP's gate and up. At the 7B shape and 256 rows k and v are two 512-wide GEMMs, too narrow to fill
an H200: q/k/v/o ran at ~320 TFLOP/s where the MLP's wide GEMMs reached ~690 (docs/benchmarks.md, item 3).

No copy of the weights: the modules' own parameters become row blocks of the fused buffer (their `.data` views of
it). What writes a parameter in place — `HFEngine.update_weights`, where every weight-sync transport of
`rlfarm.sync` ends (object store, NCCL broadcast, CUDA IPC) — writes the buffer that the fused GEMM, and a CUDA
graph captured over it, reads: a sync needs no re-fusion. What gives a parameter new storage (`module.to`,
`.data =`: the engine's sleep and wake) ends the aliasing; `Projections.refresh` sees it before the decoder's next
call and fuses again into the same `Fused` objects (so a compiled step meets the same objects and keeps its guards).

A group is fused only where its modules are plain `nn.Linear`s of one dtype, device and input width, biased all or
none; elsewhere — a peft LoRA layer, whose adapted q_proj and v_proj have forwards of their own — the modules run
as they are. Both paths compute the same products; only the GEMMs' blocking may differ, so up to float rounding.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from rlfarm.engines.llama_attention import project


def fusable(modules: Sequence[nn.Module]) -> bool:
    """Plain Linears (no adapter, no hook) reading inputs of one width, of one dtype and device, biased all or none."""
    if not all(type(module) is nn.Linear and not module._forward_hooks and not module._forward_pre_hooks
               for module in modules):
        return False
    first = modules[0].weight
    return (all(m.weight.dtype == first.dtype and m.weight.device == first.device and m.in_features ==
                modules[0].in_features for m in modules)
            and len({m.bias is None for m in modules}) == 1)


def adjacent_rows(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The tensor spanning `tensors` if they are consecutive row blocks of one contiguous storage (as fusing leaves
    them: another decoder over the same model, or a deep copy of a fused one), else None."""
    first = tensors[0]
    storage, end = first.untyped_storage().data_ptr(), first.storage_offset()
    for tensor in tensors:
        if (not tensor.numel() or not tensor.is_contiguous() or tensor.dtype != first.dtype
                or tensor.device != first.device or tensor.shape[1:] != first.shape[1:]
                or tensor.untyped_storage().data_ptr() != storage or tensor.storage_offset() != end):
            return None
        end += tensor.numel()
    return first.detach().as_strided((sum(len(t) for t in tensors), *first.shape[1:]), first.stride())


def fuse_rows(params: Sequence[nn.Parameter]) -> torch.Tensor:
    """One buffer whose row blocks are `params`: their data moved into it (the old storage freed as each moves),
    unless they already are its blocks."""
    whole = adjacent_rows(params)
    if whole is None:
        whole = torch.cat([param.detach() for param in params])
        start = 0
        for param in params:
            param.data = whole[start:start + len(param)]
            start += len(param)
    return whole


class Fused:
    """One GEMM for `modules` (fusable Linears on one input): `weight` [their outputs together, in] holds their
    weights as row blocks, `bias` their biases (None: unbiased); calling it returns each module's output."""

    def __init__(self, modules: Sequence[nn.Linear]):
        self.modules = tuple(modules)
        self.outs = tuple(module.out_features for module in modules)
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None
        self.refresh()

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return F.linear(x, self.weight, self.bias).split(self.outs, dim=-1)

    def intact(self) -> bool:
        """Whether every module's parameters still are the blocks of the buffers (nothing gave them new storage)."""
        return self.weight is not None and all(
            _block_of(whole, [getattr(module, name) for module in self.modules])
            for name, whole in (("weight", self.weight), ("bias", self.bias)) if whole is not None)

    def refresh(self) -> bool:
        """Fuse again unless intact; returns whether it did (then whatever read the old buffers must be dropped)."""
        if self.intact():
            return False
        self.weight = fuse_rows([module.weight for module in self.modules])
        self.bias = fuse_rows([module.bias for module in self.modules]) if self.modules[0].bias is not None else None
        return True

    def release(self) -> None:
        """Let go of the buffers (the engine's sleep moves the parameters elsewhere; these would keep the memory)."""
        self.weight = self.bias = None


def _block_of(whole: torch.Tensor, params: Sequence[torch.Tensor]) -> bool:
    """Whether `params` are `whole`'s consecutive row blocks, covering it (by address: cheap enough for every call)."""
    start, row = whole.data_ptr(), whole.element_size() * math.prod(whole.shape[1:])
    for param in params:
        if param.data_ptr() != start or not param.is_contiguous() or param.shape[1:] != whole.shape[1:]:
            return False
        start += row * len(param)
    return start == whole.data_ptr() + row * len(whole)


class Projections:
    """Every layer's q/k/v and gate/up, each group one `Fused` GEMM where it can be (`fuse` False: none is), else
    the modules' own forwards. The prefill calls it by layer index; the decode step passes each layer's `qkv[i]` and
    `gate_up[i]` to its pieces (`rlfarm.engines.decode_layers`)."""

    def __init__(self, layers: Sequence[nn.Module], head_dim: int, fuse: bool = True):
        self.layers, self.head_dim = layers, head_dim
        self.switch(fuse)

    def switch(self, fuse: bool) -> None:
        """Fused or per-module projections from now on (`rlfarm bench engine` times both on one engine; a graph
        captured over one path is keyed by `fuse`). Fusing again finds the parameters already the buffers' blocks:
        no copy."""
        self.fuse = fuse
        attentions, mlps = [layer.self_attn for layer in self.layers], [layer.mlp for layer in self.layers]
        self.qkv = [_fused_if(fuse, (a.q_proj, a.k_proj, a.v_proj)) for a in attentions]
        self.gate_up = [_fused_if(fuse, (m.gate_proj, m.up_proj)) if gated(m) else None for m in mlps]

    def attention(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layer i's rotated query, key and value of x (`llama_attention.project`)."""
        return project(self.layers[i].self_attn, x, cos, sin, self.head_dim, self.qkv[i])

    def mlp(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Layer i's MLP on x (`mlp_of`)."""
        return mlp_of(self.layers[i].mlp, self.gate_up[i], x)

    def refresh(self) -> bool:
        """Re-fuse every group whose parameters got new storage; whether any did."""
        return any([fused.refresh() for fused in self.groups()])  # a list: every group, not up to the first

    def release(self) -> None:
        for fused in self.groups():
            fused.release()

    def groups(self) -> list[Fused]:
        return [fused for fused in self.qkv + self.gate_up if fused is not None]


def mlp_of(mlp: nn.Module, gate_up: Fused | None, x: torch.Tensor) -> torch.Tensor:
    """A Llama-family MLP on x: down(act(gate(x)) · up(x)), gate and up from one GEMM where fused (`gate_up`)."""
    if gate_up is None:
        return mlp(x)
    gate, up = gate_up(x)
    return mlp.down_proj(mlp.act_fn(gate) * up)


def gated(mlp: nn.Module) -> bool:
    """A Llama-family MLP, down_proj(act_fn(gate_proj(x)) · up_proj(x)), that nothing hooks."""
    return (all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj", "act_fn"))
            and not mlp._forward_hooks and not mlp._forward_pre_hooks)


def _fused_if(fuse: bool, modules: tuple[nn.Module, ...]) -> Fused | None:
    return Fused(modules) if fuse and fusable(modules) else None

"""FP8 linear layers for a frozen reward tower (`reward.precision=fp8`), through PyTorch's own scaled matmul.

Why PyTorch's `torch._scaled_mm` and not torchao's float8: it ships with torch (the GPU machine has no torchao, and a
compiled torchao must match its torch build), and a frozen tower needs only the inference half of float8 training:
weights quantized once, per output channel; activations quantized per row at each call. The per-row quantization
costs more than the matmul saves unless it is fused into its neighbours, so a tower with FP8 layers runs compiled
(ClipReward compiles it whenever precision is fp8).

Scales: e4m3 holds ±448; a row's scale is its absolute maximum / 448, so each row uses the whole range.
"""
from __future__ import annotations

import torch
from torch import nn

from rlfarm.rewards.base import RewardModelError

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max


def require_fp8(device: torch.device) -> None:
    """One line when `device` has no FP8 matmuls (CUDA compute capability 8.9: Ada, 9.0: Hopper)."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
        where = "a CPU" if device.type != "cuda" else f"{torch.cuda.get_device_name(device)} (no FP8 matmuls)"
        raise RewardModelError(f"reward.precision=fp8 needs an Ada or Hopper GPU, but this labeler runs on {where}; "
                               "set reward.precision=null (the reward.dtype weights)")


def row_scales(x: torch.Tensor) -> torch.Tensor:
    """[M, K] → [M, 1] float32: each row's absolute maximum over FP8's (a zero row gets a tiny scale)."""
    return x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX


class Fp8Linear(nn.Module):
    """y = x Wᵀ + b with W and each row of x in e4m3 and one float32 scale per row of each; y in x's dtype."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()
        scale = row_scales(weight)  # [N, 1]
        self.register_buffer("weight", (weight / scale).to(FP8))  # [N, K]; .t() is the column-major operand
        self.register_buffer("weight_scale", scale.t().contiguous())  # [1, N]
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        scale = row_scales(rows)
        quantized = (rows.float() / scale).to(FP8)
        y = torch._scaled_mm(quantized, self.weight.t(), scale_a=scale, scale_b=self.weight_scale, out_dtype=x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


def to_fp8(module: nn.Module, only: tuple[str, ...] | None = None) -> int:
    """Replace every nn.Linear inside `module` (inside its children named in `only`, if given) whose sizes the FP8
    matmul takes (multiples of 16) by an Fp8Linear. Returns how many were replaced."""
    replaced = 0
    for name, child in list(module.named_children()):
        if only is not None and name not in only:
            continue
        if isinstance(child, nn.Linear) and child.in_features % 16 == 0 and child.out_features % 16 == 0:
            setattr(module, name, Fp8Linear(child))
            replaced += 1
        else:
            replaced += to_fp8(child)
    return replaced

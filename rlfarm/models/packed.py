"""Packed scoring (`algo.packed`, issue 37): the log-probabilities of `sequence_logprobs` without computing padding.

How: a piece's rows are laid out padded — left-padded prompts [B, P] then right-padded responses [B, T] — and
`sequence_logprobs` runs every column of them, padding included. `packed_logprobs` takes each row's real tokens (its
attention mask's ones, in order) and lays them end to end as one [1, N] sequence, N the real tokens; the position ids
restart at 0 with each row (the padded path's are counted from the mask: the same numbers), and attention is
block-diagonal causal: a token sees only the earlier tokens of its own row (`cu_seq_lens_*`: the rows' boundaries).
The head scores only the positions that predict a real response token (`logits_to_keep` as an index tensor, so the
chunked `ScoringHead` keeps working), and the log-probs go back to their [B, T] places: the padded path's values at
every real response token, 0 where it has padding (which every loss term masks out).

Why: the padding of a piece (left padding of short prompts, right padding of short responses, rounding its width)
goes through every layer otherwise; and a padded batch needs an attention mask, with which SDPA on CUDA cannot use its
flash kernel (it falls back to the memory-efficient one). Here the mask is gone: on CUDA `torch.nn.attention.varlen`
(`varlen_attn`, flash attention over the rows' boundaries) runs, in bf16/fp16. Elsewhere (CPU tests and CI, fp32 on
CUDA) SDPA runs with an explicit block-diagonal causal mask, so the packing and unpacking here are the code the
tests exercise; on CPU in fp32 the values equal the padded path's to float rounding.

The attention function is registered with transformers' `AttentionInterface` as "rlfarm_packed" and made the model's
implementation at its first packed forward, for good: a block recomputed in the backward pass (activation
checkpointing) must meet the same function as its forward, which a switch around the call would not guarantee.
Without `cu_seq_lens_q` among the forward's arguments it is SDPA itself, mask included, so the padded forwards of a
switched model (and its engine copy's: only weights are published) are unchanged.
"""
from __future__ import annotations

import functools
import inspect

import torch
from torch import nn

from rlfarm.models.lm import base_model, scored_tokens

PACKED = "rlfarm_packed"  # the attention implementation's name in transformers' registry
try:  # flash attention over packed rows (torch >= 2.10; CUDA only); a custom op with a fake impl, so it compiles
    from torch.nn.attention.varlen import varlen_attn
    VARLEN_ARGUMENTS = frozenset(inspect.signature(varlen_attn).parameters)
except ImportError:
    varlen_attn, VARLEN_ARGUMENTS = None, frozenset()


def packed_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_start: int,
                    temperature: float = 1.0, logit_budget: int | None = None) -> torch.Tensor:
    """`sequence_logprobs` (same inputs, same [B, T] float32 result at the real response tokens, 0 at padding) on the
    rows' real tokens only, packed into one sequence. A row's real tokens must be contiguous (left-padded prompt,
    right-padded response), as the rollout lays them out."""
    use_packed_attention(model)
    real = attention_mask.bool()
    lengths = real.sum(dim=1)
    bounds = nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)  # row i: [bounds[i], bounds[i + 1])
    longest = int(lengths.max())
    packed_index = real.flatten().long().cumsum(0).view_as(real) - 1  # each real column's place in the packed row
    response = real[:, response_start:]  # the tokens scored; the column before each predicts it
    keep = packed_index[:, response_start - 1:-1][response]
    positions = (real.long().cumsum(dim=1) - 1)[real]  # from 0 in each row, as `position_ids_from_mask`
    logprobs = scored_tokens(model, input_ids[:, response_start:][response].unsqueeze(0), temperature, logit_budget,
                             input_ids=input_ids[real].unsqueeze(0), position_ids=positions.unsqueeze(0),
                             logits_to_keep=keep, cu_seq_lens_q=bounds, cu_seq_lens_k=bounds,
                             max_length_q=longest, max_length_k=longest)
    return torch.zeros(response.shape, dtype=logprobs.dtype, device=logprobs.device).masked_scatter(response,
                                                                                                    logprobs[0])


def use_packed_attention(model: nn.Module) -> None:
    """Make `model`'s attention implementation the packed-or-SDPA one, in place (once; see the module's docstring)."""
    config = base_model(model).config
    if config._attn_implementation != PACKED:
        _register()
        config._attn_implementation = PACKED


@functools.cache
def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    sdpa_mask = ALL_MASK_ATTENTION_FUNCTIONS["sdpa"]
    signature = inspect.signature(sdpa_mask)

    def mask(*args, **kwargs):
        # a packed forward passes no mask (its rows' boundaries travel as cu_seq_lens_*): none is built, where
        # transformers would otherwise build an N × N one from the restarting position ids. Bound by name, so a
        # transformers that passes the padding mask positionally still gets SDPA's mask for it.
        padding = signature.bind_partial(*args, **kwargs).arguments.get("attention_mask")
        return None if padding is None else sdpa_mask(*args, **kwargs)

    AttentionMaskInterface.register(PACKED, mask)
    AttentionInterface.register(PACKED, packed_attention)


def packed_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs) -> tuple[torch.Tensor, None]:
    """The attention of a packed forward (query [1, H, N, D], key/value [1, H_kv, N, D]; `cu_seq_lens_q` the rows'
    boundaries): block-diagonal causal, through `varlen_attn` in half precision on CUDA, else SDPA with the mask
    spelled out. Returns [1, N, H, D], as transformers' attention functions do. Any other call: SDPA's."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    bounds = kwargs.pop("cu_seq_lens_q", None)
    if bounds is None:
        return sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if kwargs.get("sliding_window") is not None or dropout:
        raise ValueError("algo.packed: sliding-window attention and attention dropout are not supported; "
                         "set algo.packed=false for this model")
    dtype = torch.get_autocast_dtype(query.device.type) if torch.is_autocast_enabled(query.device.type) else query.dtype
    if query.is_cuda and dtype in (torch.bfloat16, torch.float16):
        return _varlen(module, *(t.to(dtype) for t in (query, key, value)), bounds, kwargs["max_length_q"],
                       scaling), None
    if query.is_cuda:  # the mask below is N x N over the whole piece (64 rows of 1,280 tokens: 6.7 GB), not B x T x T
        raise ValueError(f"algo.packed on a GPU needs bfloat16 or float16 (flash varlen attention), this forward is "
                         f"{str(dtype).removeprefix('torch.')}: set model.dtype=bfloat16 or algo.packed=false")
    rows = torch.repeat_interleave(torch.arange(len(bounds) - 1, device=query.device), bounds.diff().long(),
                                   output_size=query.shape[2])  # known: no data-dependent shape (torch.compile)
    order = torch.arange(len(rows), device=query.device)
    allowed = (rows[:, None] == rows[None, :]) & (order[None, :] <= order[:, None])  # own row, earlier tokens
    return sdpa(module, query, key, value, allowed[None, None], dropout=dropout, scaling=scaling, is_causal=False,
                **{k: v for k, v in kwargs.items() if k != "is_causal"})


def _varlen(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bounds: torch.Tensor,
            longest: int, scaling: float | None) -> torch.Tensor:
    """Flash attention over the packed rows: [1, H, N, D] in → [1, N, H, D] out. torch's `varlen_attn` changed its
    arguments between versions (2.10: `is_causal`; later: `window_size=(-1, 0)`, `scale`, `enable_gqa`): each is
    used where this torch has it, and grouped K/V heads are repeated where it has no `enable_gqa`. Its signature is
    read at import, not here: a compiled block (`algo.compile_layers`) traces this function into its graph."""
    if varlen_attn is None:
        raise RuntimeError(f"algo.packed needs torch.nn.attention.varlen (torch >= 2.10) on CUDA; this torch is "
                           f"{torch.__version__}: set algo.packed=false")
    accepts = VARLEN_ARGUMENTS
    query, key, value = (t[0].transpose(0, 1) for t in (query, key, value))  # [N, heads, D]
    options = {"window_size": (-1, 0)} if "window_size" in accepts else {"is_causal": True}
    groups = query.shape[1] // key.shape[1]
    if groups > 1 and "enable_gqa" in accepts:
        options["enable_gqa"] = True
    elif groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    if "scale" in accepts:
        options["scale"] = scaling
    elif scaling is not None and abs(scaling - query.shape[-1] ** -0.5) > 1e-12:
        raise RuntimeError(f"algo.packed: this torch's varlen_attn ({torch.__version__}) takes no scale, and "
                           f"{type(module).__name__} scales by {scaling}: set algo.packed=false")
    out = varlen_attn(*(t.contiguous() for t in (query, key, value)), bounds, bounds, longest, longest, **options)
    return out.unsqueeze(0)

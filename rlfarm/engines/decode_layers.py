"""The decode step's forward in pieces that take a layer's modules (and its fused projections) as arguments, never
an index into the model: `enter` (counters, rotary rows, embedding), `open_layer` (norm, q/k/v, rotary, the cache
write), `finish_layer` (o_proj, residual, norm, MLP, residual), `between` (one layer's finish and the next one's
open) and `close` (final norm, head, counters). The attention between them is the decoder's.

Why arguments and not indices: with the per-row kernel (`rlfarm.engines.decode_attention`, outside torch.compile)
the step's graph breaks inside its layer loop, where dynamo cannot resume, so `StaticDecoder._forward_next` runs
eagerly and dynamo compiles what it calls, frame by frame. A frame that took the layer's index (`Projections.
attention(i, ...)`, as before) was compiled again for every index, guarded on `i == k`, and past dynamo's
`recompile_limit` (8) the remaining layers ran eagerly: at the 7B shape 20 of 28 layers' rotary and SwiGLU as
unfused kernels, found on a CPU in session 10 (`tests/engines/test_decode_layers.py` counts the compilations). A
frame that takes the modules compiles once for all layers of one class: dynamo guards on their type and structure
and reads their parameters as graph inputs. Where the whole step compiles (the matmul path) these are inlined into
its one graph, as before. What does add a compilation: a fused group beside an unfused one (dynamo tells `Fused`
from None: e.g. LoRA on some layers only, `layers_to_transform`) and a piece's second batch size (after which its
batch dimension is symbolic); each counts against the same `recompile_limit`."""
from __future__ import annotations

import torch
from torch import nn

from rlfarm.engines.fused_projections import Fused, mlp_of
from rlfarm.engines.llama_attention import project


def enter(embed: nn.Module, state) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Clamp ended rows' position and column into the state's (bucket) view, mark each row's column written, and
    return (the embedded next inputs [B, 1, H], rotary cos, sin [B, 1, D])."""
    last = state.key_valid.shape[1] - 1
    state.position.clamp_(max=last)
    state.column.clamp_(max=last)
    state.key_valid.scatter_(1, state.column.unsqueeze(1), True)
    cos, sin = state.cos[state.position].unsqueeze(1), state.sin[state.position].unsqueeze(1)
    return embed(state.next_input.unsqueeze(1)), cos, sin


def open_layer(layer: nn.Module, qkv: Fused | None, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               head_dim: int, keys: torch.Tensor, values: torch.Tensor, column: torch.Tensor) -> torch.Tensor:
    """The layer's rotated query of `hidden` [B, heads, 1, D]; its key and value written into each row's `column` of
    the layer's cache views `keys`/`values` [B, kv_heads, S, D] (`qkv`: its fused projection, None: the modules').
    The write is an index_put_: inductor writes just those elements in place, where scatter_ on the cache became a
    pass over the whole cache and a copy back, per layer and step."""
    query, key, value = project(layer.self_attn, layer.input_layernorm(hidden), cos, sin, head_dim, qkv)
    rows = torch.arange(keys.shape[0], device=keys.device)
    keys[rows, :, column] = key[:, :, 0]
    values[rows, :, column] = value[:, :, 0]
    return query


def finish_layer(layer: nn.Module, gate_up: Fused | None, hidden: torch.Tensor, attended: torch.Tensor
                 ) -> torch.Tensor:
    """The rest of the layer after its attention: hidden + o_proj(attended), then + its MLP of the normed sum."""
    hidden = hidden + layer.self_attn.o_proj(attended)
    return hidden + mlp_of(layer.mlp, gate_up, layer.post_attention_layernorm(hidden))


def between(layer: nn.Module, gate_up: Fused | None, hidden: torch.Tensor, attended: torch.Tensor,
            following: nn.Module, qkv: Fused | None, cos: torch.Tensor, sin: torch.Tensor, head_dim: int,
            keys: torch.Tensor, values: torch.Tensor, column: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`finish_layer` of one layer and `open_layer` of the `following` one in one piece (its last residual add
    fuses with the next norm): (hidden, the following layer's query)."""
    hidden = finish_layer(layer, gate_up, hidden, attended)
    return hidden, open_layer(following, qkv, hidden, cos, sin, head_dim, keys, values, column)


def close(norm: nn.Module, head: nn.Module, hidden: torch.Tensor, state) -> None:
    """The next token's logits into the state, with the version that computed them; counters one column on (an
    ended row keeps stepping: its output is not read, and it is clamped at the next step)."""
    state.logits.copy_(head(norm(hidden))[:, -1])
    state.logits_version.copy_(state.version.expand(hidden.shape[0]))
    state.position.add_(1)
    state.column.add_(1)

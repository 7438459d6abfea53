"""Fast decoding for Llama-family Hugging Face models (llama, qwen2, qwen3): a preallocated KV cache,
attention of our own over it, and on CUDA the whole decode step — sample, record, forward one token —
captured once in a CUDA graph, so a step costs one graph launch and the host never waits on the device
(except every `stop_check_every` steps, to stop when every sample has ended).

Only the attention core and the cache are ours. Norms, projections (with their LoRA adapters when peft
wrapped them), MLPs, the rotary table and the LM head are the model's own modules, called as they are:
the weights the learner trains are the weights that run here, `update_weights` copies into them in place
(a captured graph reads the same memory, so it needs no re-capture), and the log-probabilities follow the
convention of `rlfarm.data` exactly.

A cache of one shape — batch × cache length, rounded up to `CACHE_ROUNDING` tokens so prompts of slightly
different length share it — holds its graphs, one per sampling setting (temperature, top_p, eos). Prefill
runs once per call, on each distinct prompt once (the n samples of a prompt share its prompt cache).
Finished rows keep decoding until all rows end (no continuous refill: an RL round is a fixed batch).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from rlfarm.engines.base import hits_stop
from rlfarm.engines.sampling import Rows, sample_tokens
from rlfarm.models.lm import position_ids_from_mask

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
CACHE_ROUNDING = 64


def base_model(model: nn.Module) -> nn.Module:
    """The HF causal LM under a peft wrapper (its linear layers still carry the adapters)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def supports(model: nn.Module) -> bool:
    """Whether `StaticDecoder` can run this model: a Llama-family layout with full (not sliding) attention."""
    base = base_model(model)
    decoder = getattr(base, "model", None)
    if getattr(base.config, "model_type", None) not in SUPPORTED_MODEL_TYPES or decoder is None:
        return False
    if not all(hasattr(decoder, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return False
    return all(getattr(layer.self_attn, "sliding_window", None) is None for layer in decoder.layers)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE as the Llama family applies it. x [B, heads, L, D]; cos, sin [B, L, D]."""
    return x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1)


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, kv_heads, L, D] → [B, kv_heads × groups, L, D], each kv head serving `groups` query heads."""
    if groups == 1:
        return x
    batch, heads, length, dim = x.shape
    return x[:, :, None].expand(batch, heads, groups, length, dim).reshape(batch, heads * groups, length, dim)


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_p: float
    stop_ids: tuple[int, ...]  # () = never stop (`rlfarm.data.stop_ids`)


@dataclass
class DecodeState:
    """Every tensor a decode step reads or writes, allocated once per (batch, cache length) so a captured
    graph can replay on them. Slot s of the cache holds the key/value of the token at column s."""

    keys: list[torch.Tensor]          # per layer [B, kv_heads, S, D]
    values: list[torch.Tensor]
    cos: torch.Tensor                 # [S, D] rotary table by position
    sin: torch.Tensor
    key_valid: torch.Tensor           # [B, S] bool: slots a query may attend to
    logits: torch.Tensor              # [B, V] the logits the next token is sampled from
    race: torch.Tensor                # [B, V] float32 Exp(1) noise of the next sample: this batch's rows of `drawn`
    drawn: torch.Tensor               # [R, V] the noise drawn per step: R = B, or the whole step's rows (`Rows`)
    next_input: torch.Tensor          # [B] the token fed at the next forward
    position: torch.Tensor            # [B] its position id
    step: torch.Tensor                # [1] index of the next sampled token
    slot: torch.Tensor                # [1] cache slot of the next forward (= prompt length + step)
    finished: torch.Tensor            # [B] bool
    tokens: torch.Tensor              # [B, S] sampled tokens (pad after the end)
    logprobs: torch.Tensor            # [B, S] float32
    generated: torch.Tensor           # [B, S] bool: the token was generated before the row ended
    graphs: dict = field(default_factory=dict)  # Sampling → torch.cuda.CUDAGraph


class StaticDecoder:
    """Generates from left-padded prompts with a static KV cache; CUDA-graphed steps on CUDA, eager on CPU."""

    def __init__(self, model: nn.Module, pad_id: int, generator: torch.Generator, cuda_graphs: bool = True,
                 compile: bool = False, max_cached_shapes: int = 3):
        if not supports(model):
            raise ValueError(f"StaticDecoder runs {SUPPORTED_MODEL_TYPES} models with full attention")
        self.model, self.pad_id, self.generator = model, pad_id, generator
        self.base = base_model(model)
        self.layers = self.base.model.layers
        config = self.base.config
        attention = self.layers[0].self_attn
        self.head_dim = attention.head_dim
        self.kv_heads = config.num_key_value_heads
        self.groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = attention.scaling
        self.cuda_graphs, self.max_cached_shapes = cuda_graphs, max_cached_shapes
        self.states: OrderedDict[tuple[int, int], DecodeState] = OrderedDict()
        # compile fuses the many small kernels of a step (norms, rotary, sampling) before graph capture; batch
        # and cache length are marked dynamic (`_state`), so one compilation serves every shape
        self.compiled = compile
        self._sample_fn = torch.compile(self._sample_and_record) if compile else self._sample_and_record
        self._forward_fn = torch.compile(self._forward_next) if compile else self._forward_next

    @property
    def device(self) -> torch.device:
        return self.base.lm_head.weight.device

    def release(self) -> None:
        """Drop caches and graphs (they point at memory that `sleep` gives back)."""
        self.states.clear()

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, prompt_mask: torch.Tensor, n: int, max_new_tokens: int,
                 sampling: Sampling, stop_check_every: int, rows: Rows | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """prompt, prompt_mask [num_prompts, P] (left-padded, on the model's device); n samples each.
        rows: where these samples sit in a step shared by several engines (None: they are the whole step).
        Returns (tokens, logprobs, generated) [num_prompts × n, steps], prompt-major, still on the device."""
        prompts, prompt_len = prompt.shape
        state = self._state(prompts * n, prompt_len + max_new_tokens, rows or Rows(0, prompts * n))
        graphed = self._use_graphs() and max_new_tokens > 1  # one new token: no step to replay
        step = self._graph(state, sampling) if graphed else (lambda: self._step(state, sampling))
        self._prefill(state, prompt, prompt_mask, n)
        steps = max_new_tokens
        for t in range(max_new_tokens - 1):
            step()
            if sampling.stop_ids and (t + 1) % stop_check_every == 0 and bool(state.finished.all()):
                steps = t + 1
                break
        else:
            self._draw_race(state, sampling)
            self._sample_fn(state, sampling)  # the last token needs no forward
        return state.tokens[:, :steps], state.logprobs[:, :steps], state.generated[:, :steps]

    # -- one decode step -------------------------------------------------------------------------------
    def _step(self, state: DecodeState, sampling: Sampling) -> None:
        self._draw_race(state, sampling)
        self._sample_fn(state, sampling)
        self._forward_fn(state)

    def _draw_race(self, state: DecodeState, sampling: Sampling) -> None:
        if sampling.temperature > 0:
            state.drawn.exponential_(generator=self.generator)

    def _sample_and_record(self, state: DecodeState, sampling: Sampling) -> None:
        token, logprob = sample_tokens(state.logits, sampling.temperature, sampling.top_p, race=state.race)
        ended = state.finished
        token = token.masked_fill(ended, self.pad_id)
        state.tokens.index_copy_(1, state.step, token.unsqueeze(1))
        state.logprobs.index_copy_(1, state.step, logprob.masked_fill(ended, 0.0).unsqueeze(1))
        state.generated.index_copy_(1, state.step, (~ended).unsqueeze(1))
        state.next_input.copy_(token)
        if sampling.stop_ids:
            state.finished.logical_or_(hits_stop(token, sampling.stop_ids))
        state.step.add_(1)

    def _forward_next(self, state: DecodeState) -> None:
        """Feed `next_input` at `position`, its key/value into cache slot `slot`; logits of what follows."""
        state.key_valid.index_fill_(1, state.slot, True)
        visible = state.key_valid[:, None, None, :]  # [B, 1, 1, S]
        cos, sin = state.cos[state.position].unsqueeze(1), state.sin[state.position].unsqueeze(1)  # [B, 1, D]
        hidden = self.base.model.embed_tokens(state.next_input.unsqueeze(1))  # [B, 1, H]
        for i, layer in enumerate(self.layers):
            attention = layer.self_attn
            query, key, value = self._project(attention, layer.input_layernorm(hidden), cos, sin)
            state.keys[i].index_copy_(2, state.slot, key)
            state.values[i].index_copy_(2, state.slot, value)
            hidden = hidden + attention.o_proj(self._attend_cache(query, state.keys[i], state.values[i], visible))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        state.logits.copy_(self.base.lm_head(self.base.model.norm(hidden))[:, -1])
        state.position.add_(1)
        state.slot.add_(1)

    def _attend_cache(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      visible: torch.Tensor) -> torch.Tensor:
        """One query token per row against the whole cache, grouped-query without copying the cache.
        query [B, heads, 1, D], keys/values [B, kv_heads, S, D], visible [B, 1, 1, S] → [B, 1, heads × D]."""
        batch = query.shape[0]
        grouped = query.reshape(batch, self.kv_heads, self.groups, self.head_dim)
        scores = torch.matmul(grouped, keys.transpose(2, 3)).float() * self.scaling  # [B, kv_heads, G, S]
        weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1).to(values.dtype)
        return torch.matmul(weights, values).reshape(batch, 1, -1)

    def _project(self, attention: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, L, H] → rotated query [B, heads, L, D], rotated key and value [B, kv_heads, L, D]."""
        batch, length, _ = x.shape
        query = attention.q_proj(x).view(batch, length, -1, self.head_dim)
        key = attention.k_proj(x).view(batch, length, -1, self.head_dim)
        value = attention.v_proj(x).view(batch, length, -1, self.head_dim)
        if hasattr(attention, "q_norm"):  # qwen3 normalizes each head's query and key
            query, key = attention.q_norm(query), attention.k_norm(key)
        query, key, value = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
        return apply_rotary(query, cos, sin), apply_rotary(key, cos, sin), value

    # -- per call -------------------------------------------------------------------------------------
    def _prefill(self, state: DecodeState, prompt: torch.Tensor, prompt_mask: torch.Tensor, n: int) -> None:
        """Run the distinct prompts once: their keys/values fill slots [0, P) of their n rows each, their last
        logits seed the first sample; reset the per-call state."""
        prompts, prompt_len = prompt.shape
        valid = prompt_mask.bool()
        positions = position_ids_from_mask(prompt_mask)
        cos, sin = state.cos[positions], state.sin[positions]  # [prompts, P, D]
        causal = torch.ones(prompt_len, prompt_len, dtype=torch.bool, device=prompt.device).tril()
        # a query sees earlier real tokens and itself (so a pad query's softmax is never empty)
        allowed = (causal & valid[:, None, None, :]) | torch.eye(prompt_len, dtype=torch.bool, device=prompt.device)
        hidden = self.base.model.embed_tokens(prompt)
        for i, layer in enumerate(self.layers):
            attention = layer.self_attn
            query, key, value = self._project(attention, layer.input_layernorm(hidden), cos, sin)
            state.keys[i][:, :, :prompt_len].copy_(key.repeat_interleave(n, dim=0))
            state.values[i][:, :, :prompt_len].copy_(value.repeat_interleave(n, dim=0))
            state.keys[i][:, :, prompt_len:].zero_()  # stale slots are masked, but 0 × NaN would not be
            state.values[i][:, :, prompt_len:].zero_()
            out = F.scaled_dot_product_attention(query, repeat_kv(key, self.groups), repeat_kv(value, self.groups),
                                                 attn_mask=allowed, scale=self.scaling)
            hidden = hidden + attention.o_proj(out.transpose(1, 2).reshape(prompts, prompt_len, -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        last = self.base.lm_head(self.base.model.norm(hidden[:, -1:]))[:, -1]
        state.logits.copy_(last.repeat_interleave(n, dim=0))
        state.key_valid.zero_()
        state.key_valid[:, :prompt_len] = valid.repeat_interleave(n, dim=0)
        state.position.copy_(prompt_mask.sum(dim=1).repeat_interleave(n))
        state.step.zero_()
        state.slot.fill_(prompt_len)
        state.finished.zero_()
        state.tokens.fill_(self.pad_id)
        state.logprobs.zero_()
        state.generated.zero_()

    def _state(self, batch: int, length: int, rows: Rows) -> DecodeState:
        cache_len = -(-length // CACHE_ROUNDING) * CACHE_ROUNDING
        key = (batch, cache_len, rows)
        if key in self.states:
            self.states.move_to_end(key)
            return self.states[key]
        while len(self.states) >= self.max_cached_shapes:
            self.states.popitem(last=False)
        device, dtype = self.device, self.base.lm_head.weight.dtype
        zeros = lambda *shape, dtype=dtype: torch.zeros(*shape, dtype=dtype, device=device)  # noqa: E731
        cache_shape = (batch, self.kv_heads, cache_len, self.head_dim)
        probe = torch.zeros(1, dtype=dtype, device=device)
        cos, sin = self.base.model.rotary_emb(probe, torch.arange(cache_len, device=device)[None])
        vocab = self.base.lm_head.out_features
        drawn = torch.ones(max(rows.total, batch), vocab, device=device)
        state = DecodeState(
            keys=[zeros(*cache_shape) for _ in self.layers], values=[zeros(*cache_shape) for _ in self.layers],
            cos=cos[0], sin=sin[0], key_valid=zeros(batch, cache_len, dtype=torch.bool),
            logits=zeros(batch, vocab), race=drawn[rows.first:rows.first + batch], drawn=drawn,
            next_input=zeros(batch, dtype=torch.long), position=zeros(batch, dtype=torch.long),
            step=zeros(1, dtype=torch.long), slot=zeros(1, dtype=torch.long),
            finished=zeros(batch, dtype=torch.bool), tokens=zeros(batch, cache_len, dtype=torch.long),
            logprobs=zeros(batch, cache_len, dtype=torch.float32), generated=zeros(batch, cache_len, dtype=torch.bool))
        if self.compiled:
            for tensor in (*state.keys, *state.values, state.key_valid, state.tokens, state.logprobs, state.generated):
                torch._dynamo.maybe_mark_dynamic(tensor, 0)
                torch._dynamo.maybe_mark_dynamic(tensor, -2 if tensor.dim() == 4 else 1)
            for tensor in (state.logits, state.race, state.next_input, state.position, state.finished):
                torch._dynamo.maybe_mark_dynamic(tensor, 0)
            for tensor in (state.cos, state.sin):
                torch._dynamo.maybe_mark_dynamic(tensor, 0)
        self.states[key] = state
        return state

    # -- CUDA graphs ----------------------------------------------------------------------------------
    def _use_graphs(self) -> bool:
        return self.cuda_graphs and self.device.type == "cuda"

    def _graph(self, state: DecodeState, sampling: Sampling):
        """The replay function of this state's step graph for these sampling settings (captured once)."""
        if sampling not in state.graphs:
            # warm up on a side stream first (compiles, and lets cuBLAS and the allocator settle); the
            # state's contents are garbage afterwards, `_prefill` resets them, and the generator is put back
            # where it was, so a seed gives the same samples with graphs as without
            rng = self.generator.get_state()
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._step(state, sampling)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            graph.register_generator_state(self.generator)
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self._step(state, sampling)
            self.generator.set_state(rng)
            state.graphs[sampling] = graph
        return state.graphs[sampling].replay

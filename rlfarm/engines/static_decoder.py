"""Fast decoding for Llama-family Hugging Face models (llama, qwen2, qwen3): a slot-major KV cache, attention of
our own over it, continuous refill, and on CUDA the whole decode step — sample, record, forward one token —
captured in a CUDA graph per active-batch bucket, so a step costs one graph launch.

Only the attention core and the cache are ours. Norms, projections (with their LoRA adapters when peft
wrapped them), MLPs, the rotary table and the LM head are the model's own modules and weights (q/k/v, and the MLP's
gate/up, run as one GEMM over a buffer whose row blocks are the modules' parameters: `fuse_projections`,
`rlfarm.engines.fused_projections`): the weights the learner trains are the weights that run here, `update_weights`
copies into them in place (a captured graph reads the same memory, so it needs no re-capture), and the
log-probabilities follow the convention of `rlfarm.data` exactly.

Slots and refill. A call's samples (n per prompt, prompt-major) queue for `slots` batch rows. With `refill`, a row
whose sample ended (its end token, the cap, or a synthetic length: `rlfarm.engines.synthetic_lengths`) hands its
slot to the next queued sample at the next check (every `stop_check_every` steps): the newcomer's prefill writes its
prompt into that slot's cache row while the other rows keep their place, and decoding goes on, until the call's
samples are all done. A prompt runs through the model once per call: a later sample of it starts from a copy of a
row that holds it (`share_prompts`, `rlfarm.engines.prompt_donors`). Once the queue is empty the batch shrinks
through buckets (the slots, then powers of two down to MIN_BUCKET): the rows still running move to the lowest slots
and the step runs on that prefix. Without `refill` the slots decode in waves, each to its longest sample: the fixed
batch, the baseline.
Attention. On CUDA a flash-decoding kernel reads each row only up to its own newest column
(`rlfarm.engines.decode_attention`), so a refilled row does not pay for the furthest row's columns; elsewhere
(`attention="matmul"`) two matmuls read every row up to a context bucket, a multiple of `context_step` columns
that holds what the running rows write before the next check (None: the whole allocated row, P + cap columns).
Each (batch bucket, context bucket) has its graph (the kernel's grid spans the bucket too), all in one memory pool.
The cache is slot-major and fixed (slots × cache length, rounded up to CACHE_ROUNDING tokens), not paged: RL
calls share one cap, so a slot never needs more than its row, and the bucket views and graphs need tensors that
do not move.
Sampling is reproducible across all this: a sample's noise is keyed by (call seed, its index in the step, its
token index) (`rlfarm.engines.noise`), so the same seed gives the same samples with or without refill, whatever
slot a sample lands in, as far as the batch-size dependence of the arithmetic allows.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from rlfarm.engines import decode_graphs, decode_layers, decode_state
from rlfarm.engines.decode_attention import attend_rows, available as row_kernel_available
from rlfarm.engines.base import hits_stop
from rlfarm.engines.buckets import CACHE_ROUNDING, CONTEXT_STEP, buckets, contexts
from rlfarm.engines.decode_state import DecodeState
from rlfarm.engines.fused_projections import Projections
from rlfarm.engines.llama_attention import attend_cache
from rlfarm.engines.prefill import run_prompts
from rlfarm.engines.prompt_donors import PromptDonors, copy_prompt_rows
from rlfarm.engines.noise import race_noise
from rlfarm.engines.sampling import sample_tokens
from rlfarm.engines.synthetic_lengths import SyntheticLengths

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")


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


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_p: float
    stop_ids: tuple[int, ...]  # sampling one of these ends a sample; () = never (`rlfarm.data.stop_ids`)
    end_id: int | None = None  # what a synthetic length forces at a sample's end (None: it is cut there)


@dataclass(frozen=True)
class Calls:
    """What one `generate` call did: decode steps run, prefill calls, the slots it ran on, the smallest
    active-batch bucket it stepped, and the cache columns its steps attended to, on average."""
    decode_steps: int
    prefills: int
    slots: int
    smallest_bucket: int
    mean_context: float
    prompt_forwards: int = 0  # prompts run through the model (each once per call, `share_prompts`)
    prompt_copies: int = 0    # samples started from another slot's copy of their prompt
    capture_s: float = 0.0    # seconds its graph captures took ("ahead": with their warm-ups, and compiling at first;
    graphs_captured: int = 0  # "first_use": the captures alone) and how many (`decode_graphs`)
    eager_steps: int = 0      # "first_use": steps of pairs without a graph yet, run eagerly (compiling at first)

    def capture_stats(self) -> dict:
        return {"capture_s": self.capture_s, "graphs_captured": self.graphs_captured, "eager_steps": self.eager_steps}


class StaticDecoder:
    """Generates from left-padded prompts with a slot-major static KV cache; CUDA-graphed steps on CUDA, eager
    on CPU."""

    def __init__(self, model: nn.Module, pad_id: int, cuda_graphs: bool = True, compile: bool = False,
                 max_cached_shapes: int = 3, context_step: int | None = CONTEXT_STEP, attention: str = "auto",
                 fuse_projections: bool = True, share_prompts: bool = True, capture: str = "ahead"):
        if not supports(model):
            raise ValueError(f"StaticDecoder runs {SUPPORTED_MODEL_TYPES} models with full attention")
        self.model, self.pad_id = model, pad_id
        self.base = base_model(model)
        self.layers = self.base.model.layers
        config = self.base.config
        first = self.layers[0].self_attn
        self.head_dim, self.scaling = first.head_dim, first.scaling
        self.kv_heads = config.num_key_value_heads
        self.groups = config.num_attention_heads // config.num_key_value_heads
        self.cuda_graphs, self.max_cached_shapes = cuda_graphs, max_cached_shapes
        # "ahead", "first_use" or "auto" (`rlfarm.engines.decode_graphs`); auto: first_use once a sleep drops the graphs
        self.capture = "ahead" if decode_graphs.check_capture(capture) == "auto" else capture
        self.capture_after_sleep = "first_use" if capture == "auto" else capture
        self.context_step = context_step  # columns between context buckets (None: attend to the whole row)
        # "rows": the per-row kernel, "matmul": two matmuls over the bucket, "auto": rows where Triton runs (CUDA)
        if attention not in ("auto", "rows", "matmul"):
            raise ValueError(f"attention must be auto, rows or matmul, not {attention!r}")
        self.attention = attention
        self.projections = Projections(self.layers, self.head_dim, fuse_projections)  # q/k/v, gate/up: a GEMM each
        self.share_prompts = share_prompts  # False: every fill runs its prompts again (rlfarm.engines.prompt_donors)
        self.states: OrderedDict[tuple[int, int], DecodeState] = OrderedDict()
        self.last_call: Calls | None = None
        self.graphs_captured, self.capture_s, self.eager_steps = 0, 0.0, 0  # over its life (a sleep drops graphs)
        # compile fuses the many small kernels of a step (norms, rotary, noise, sampling) before graph capture;
        # slots and cache length are marked dynamic (`decode_state.mark_dynamic`): one compilation for all shapes.
        # With the per-row kernel (outside the graph: `attend_rows`) the break falls inside the layer loop,
        # where dynamo cannot resume: `_forward_next` then runs eagerly and what it calls is compiled, frame by
        # frame, once for all layers (`rlfarm.engines.decode_layers`)
        self.compiled = compile
        if compile:  # a compilation inside a capture would spoil it: the log names any recompilation's failed guard
            torch._logging.set_logs(recompiles=True)
        self._sample_fn = torch.compile(self._sample_and_record) if compile else self._sample_and_record
        self._forward_fn = torch.compile(self._forward_next) if compile else self._forward_next

    @property
    def device(self) -> torch.device:
        return self.base.lm_head.weight.device

    @property
    def graphed(self) -> bool:  # steps run as CUDA graphs (else eagerly)
        return self.cuda_graphs and self.device.type == "cuda"

    @property
    def row_kernel(self) -> bool:
        """Whether steps attend through the per-row kernel (else the matmul path)."""
        auto = self.attention == "auto" and self.device.type == "cuda" and row_kernel_available(self.device)
        return auto or self.attention == "rows"

    def release(self) -> None:
        """Drop caches, graphs and fused buffers (they point at memory that `sleep` gives back)."""
        self.states.clear()
        self.projections.release()
        self.capture = self.capture_after_sleep

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, prompt_mask: torch.Tensor, n: int, max_new_tokens: int,
                 sampling: Sampling, stop_check_every: int, seed: int, first_sample: int = 0,
                 max_batch: int | None = None, refill: bool = True, lengths: SyntheticLengths | None = None,
                 weights: Callable[[], int] = lambda: 0
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """prompt, prompt_mask [num_prompts, P] (left-padded, on the model's device); n samples each, at most
        `max_batch` at a time (None: all at once). first_sample: the index of this call's first sample in the
        step (engines that split a step: `Rows`), which keys its noise. lengths: the synthetic length model.
        weights: asked before the first step and between blocks of steps for the version of the weights the next
        steps run (an engine may load new ones inside it: partial rollouts, `rlfarm.engines.weight_gate`); each
        token records the version whose logits it was sampled from.
        Returns (tokens, logprobs, generated, versions) [num_prompts × n, width], prompt-major, still on the device;
        width = the longest sample."""
        prompts, prompt_len = prompt.shape
        samples = prompts * n
        before = self._capture_totals()
        state, sizes, steps = self.prepare(samples, prompt_len, max_new_tokens, sampling, max_batch, refill,
                                           ragged=bool(sampling.stop_ids) or lengths is not None)
        windows = contexts(state.cache_len, prompt_len, self.context_step)
        slots = state.slots
        state.seed.fill_(seed)
        donors = PromptDonors()  # a prompt runs once per call: more of its samples start from a copy of its row

        def load_version() -> None:  # the weights the next steps and prefills run (donors of older ones are stale)
            version = weights()
            state.version.fill_(version)
            donors.at_version(version)

        load_version()
        state.finished.fill_(True)
        ids = torch.arange(samples, device=self.device) + first_sample
        limits = (lengths.draw(seed, ids, max_new_tokens) if lengths is not None
                  else torch.full((samples,), max_new_tokens, dtype=torch.long, device=self.device))
        forced = limits - 1 if lengths is not None and sampling.end_id is not None else torch.full_like(limits, -1)
        forced = forced.masked_fill(limits >= max_new_tokens, -1)  # at the cap a sample is cut, not ended
        limit_of = limits.tolist()
        out = (torch.full((samples, max_new_tokens), self.pad_id, dtype=torch.long, device=self.device),
               torch.zeros(samples, max_new_tokens, device=self.device),
               torch.zeros(samples, max_new_tokens, dtype=torch.bool, device=self.device),
               torch.zeros(samples, max_new_tokens, dtype=torch.long, device=self.device))
        holder: list[int | None] = [None] * slots  # slot → the sample it holds
        started = [0] * slots                     # slot → decode steps run when its sample started
        queue, decoded, prefills, smallest, attended = 0, 0, 0, slots, 0

        def fill(free: list[int]) -> None:
            nonlocal queue, prefills
            taken = list(range(queue, min(queue + len(free), samples)))
            if not taken:
                return
            slot_list = free[:len(taken)]
            self._prefill(state, prompt, prompt_mask, n, slot_list, taken, limits, forced, ids, donors)
            for slot, sample in zip(slot_list, taken):
                holder[slot], started[slot] = sample, decoded
            queue += len(taken)
            prefills += 1

        fill(list(range(slots)))
        while any(sample is not None for sample in holder):
            active = [slot for slot, sample in enumerate(holder) if sample is not None]
            size = min(size for size in sizes if size > active[-1])
            smallest = min(smallest, size)
            # a check every stop_check_every steps, sooner when every row reaches its limit before that
            longest = max(limit_of[holder[s]] - (decoded - started[s]) for s in active)
            block = max(1, min(stop_check_every, longest))
            # a row's column is at most P + its steps so far; the block writes `block` more
            furthest = prompt_len + max(decoded - started[s] for s in active) + block
            context = next(window for window in windows if window >= furthest)
            for i in range(block):
                if i == longest - 1:  # every row samples its last token: no forward needed after it
                    self._sample_fn(state.view(size), sampling)
                else:
                    steps[size, context]()
            decoded += block
            attended += block * context
            done = state.finished[:size].tolist()
            ended = [s for s in active if done[s]] if refill else (active if all(done[s] for s in active) else [])
            if ended:
                self._harvest(state, out, ended, [holder[s] for s in ended], max_new_tokens)
                for slot in ended:
                    holder[slot] = None
            load_version()  # new weights, if any, before the free slots' prefill
            if ended:
                fill([slot for slot in range(slots) if holder[slot] is None])
            if refill and queue == samples:
                decode_state.shrink(state, holder, started, sizes)
                donors.clear()  # rows moved (and nothing is left to start)
        self.last_call = Calls(decoded, prefills, slots, smallest, attended / max(decoded, 1), donors.forwards,
                               donors.copies, *(now - then for now, then in zip(self._capture_totals(), before)))
        width = max(int(out[2].sum(dim=1).max()), 1)
        return tuple(tensor[:, :width] for tensor in out)

    @torch.no_grad()  # the capture compiles: under autograd inductor would trace a backward of the cache writes
    def prepare(self, samples: int, prompt_len: int, max_new_tokens: int, sampling: Sampling,
                max_batch: int | None = None, refill: bool = True, ragged: bool = True):
        """The state of a call of this shape and the step of each of its buckets: on CUDA their graphs are
        captured here (compiling first, when compile is on), before any slot is filled — call it ahead to keep
        capture out of a timed or latency-bound call. ragged: samples may end at different steps (an end token
        or synthetic lengths); else they end together and one bucket serves. Returns (state, buckets, steps), steps
        keyed by (batch bucket, context bucket)."""
        if self.projections.refresh():  # the weights got new storage (a wake): graphs read the old fused buffers
            self.states.clear()
        slots = min(max_batch or samples, samples)
        state = self._state(slots, prompt_len + max_new_tokens)
        sizes = buckets(slots) if refill and ragged else [slots]
        windows = contexts(state.cache_len, prompt_len, self.context_step)
        return state, sizes, {(size, context): self._stepper(state, size, context, sampling)
                              for size in sizes for context in windows}

    def _harvest(self, state: DecodeState, out, slots: list[int], samples: list[int], width: int) -> None:
        """Copy the ended samples of `slots` into the call's output rows `samples`."""
        src = torch.tensor(slots, device=self.device)
        dst = torch.tensor(samples, device=self.device)
        for target, source in zip(out, (state.tokens, state.logprobs, state.generated, state.versions)):
            target.index_copy_(0, dst, source.index_select(0, src)[:, :width])

    # -- one decode step -------------------------------------------------------------------------------
    @torch.no_grad()  # it writes into views of the cache, which autograd forbids outside no_grad
    def _step(self, state: DecodeState, sampling: Sampling) -> None:
        self._sample_fn(state, sampling)
        self._forward_fn(state)

    def _sample_and_record(self, state: DecodeState, sampling: Sampling) -> None:
        race = (race_noise(state.seed, state.sample_id, state.step, state.column_keys)
                if sampling.temperature > 0 else None)
        force = state.step == state.forced_at
        forcing = sampling.end_id is not None
        token, logprob = sample_tokens(state.logits, sampling.temperature, sampling.top_p, race=race,
                                       force=force if forcing else None, forced_token=sampling.end_id if forcing else 0)
        ended = state.finished
        token = token.masked_fill(ended, self.pad_id)
        at = state.step.unsqueeze(1)
        state.tokens.scatter_(1, at, token.unsqueeze(1))
        state.logprobs.scatter_(1, at, logprob.masked_fill(ended, 0.0).unsqueeze(1))
        state.generated.scatter_(1, at, (~ended).unsqueeze(1))
        state.versions.scatter_(1, at, state.logits_version.unsqueeze(1))
        state.next_input.copy_(token)
        ends = state.step + 1 >= state.limit
        if sampling.stop_ids:
            ends = ends | hits_stop(token, sampling.stop_ids)
        state.step.add_((~ended).long())
        state.finished.logical_or_(ends)

    def _forward_next(self, state: DecodeState) -> None:
        """Feed `next_input` at `position`, its key/value into cache `column`; logits of what follows. The state may
        be a context bucket's view: a running row's column lies inside it; an ended or empty row's is clamped
        into it (its writes land in its own row, which its next sample's prefill resets). Its pieces take each
        layer's modules, not its index (`rlfarm.engines.decode_layers` says why)."""
        hidden, cos, sin = decode_layers.enter(self.base.model.embed_tokens, state)
        row_kernel = self.row_kernel
        visible = None if row_kernel else state.key_valid[:, None, None, :]  # the matmul path's mask [B, 1, 1, S]
        layers, qkv, gate_up = self.layers, self.projections.qkv, self.projections.gate_up
        query = decode_layers.open_layer(layers[0], qkv[0], hidden, cos, sin, self.head_dim, state.keys[0],
                                         state.values[0], state.column)
        for i, layer in enumerate(layers):
            if row_kernel:  # each row reads up to its newest column
                attended = attend_rows(query, state.keys[i], state.values[i], state.key_valid, state.column,
                                       self.groups, float(self.scaling))
            else:
                attended = attend_cache(query, state.keys[i], state.values[i], visible, self.groups, self.scaling)
            if i + 1 < len(layers):
                hidden, query = decode_layers.between(layer, gate_up[i], hidden, attended, layers[i + 1], qkv[i + 1],
                                                      cos, sin, self.head_dim, state.keys[i + 1],
                                                      state.values[i + 1], state.column)
            else:
                hidden = decode_layers.finish_layer(layer, gate_up[i], hidden, attended)
        decode_layers.close(self.base.model.norm, self.base.lm_head, hidden, state)

    # -- a sample takes a slot ------------------------------------------------------------------------
    def _prefill(self, state: DecodeState, prompt: torch.Tensor, prompt_mask: torch.Tensor, n: int,
                 slots: list[int], samples: list[int], limits: torch.Tensor, forced: torch.Tensor,
                 ids: torch.Tensor, donors: PromptDonors) -> None:
        """Start `samples` in `slots`: each prompt that no slot holds yet runs once (`prefill.run_prompts`); a
        sample whose prompt a slot holds starts from a copy of that row (`rlfarm.engines.prompt_donors`); each
        sample's first token is drawn from its prompt's last logits; the slots' counters are reset."""
        prompt_len = prompt.shape[1]
        prompts = [sample // n for sample in samples]
        copied, fresh = donors.split(slots, prompts) if self.share_prompts else ([], list(range(len(slots))))
        rows = torch.tensor(slots, device=self.device)
        last = torch.empty(len(slots), self.base.config.hidden_size, device=self.device,
                           dtype=self.base.model.embed_tokens.weight.dtype)  # the hidden states' dtype
        if copied:  # before any forward writes a row: a donor may be taken by a fresh prompt in this fill
            sources, last[copied] = donors.serve([prompts[i] for i in copied])
            copy_prompt_rows([*state.keys, *state.values], torch.tensor([slots[i] for i in copied], device=self.device),
                             torch.tensor(sources, device=self.device), prompt_len)
        if fresh:
            distinct, prompt_last, counts = run_prompts(self, state, prompt, prompt_mask, [slots[i] for i in fresh],
                                                        [prompts[i] for i in fresh])
            last[fresh] = prompt_last.repeat_interleave(counts, dim=0, output_size=len(fresh))
            donors.remember(distinct, prompt_last)
        donors.record(slots, prompts)
        taken = torch.tensor(samples, device=self.device)
        state.start(rows, prompt_mask[torch.tensor(prompts, device=self.device)],
                    self.base.lm_head(self.base.model.norm(last[:, None]))[:, -1], limits[taken], forced[taken],
                    ids[taken], self.pad_id)

    def _state(self, slots: int, length: int) -> DecodeState:
        cache_len = -(-length // CACHE_ROUNDING) * CACHE_ROUNDING
        key = (slots, cache_len)
        if key in self.states:
            self.states.move_to_end(key)
            return self.states[key]
        while len(self.states) >= self.max_cached_shapes:
            self.states.popitem(last=False)
        device, dtype = self.device, self.base.lm_head.weight.dtype
        probe = torch.zeros(1, dtype=dtype, device=device)
        cos, sin = self.base.model.rotary_emb(probe, torch.arange(cache_len, device=device)[None])
        state = decode_state.allocate(slots, cache_len, len(self.layers), self.kv_heads, self.head_dim,
                                      self.base.lm_head.out_features, cos[0], sin[0], dtype, device)
        self.states[key] = state
        return state

    # -- CUDA graphs ----------------------------------------------------------------------------------
    def _stepper(self, root: DecodeState, size: int, context: int, sampling: Sampling):
        """The step of `root`'s view at (batch bucket, context bucket): on CUDA its graph's replay, captured ahead
        or at first use (`rlfarm.engines.decode_graphs`), else the eager step."""
        state = root.view(size, context)
        if self.compiled:
            decode_state.mark_dynamic(state)
        run = lambda: self._step(state, sampling)  # noqa: E731
        if not self.graphed:
            return run
        key = (size, context, sampling, self.row_kernel, self.projections.fuse)
        if key in root.graphs:
            return root.graphs[key].replay
        if self.capture == "first_use":
            return decode_graphs.FirstUse(root, key, run, self.device, self._captured, self._stepped_eagerly)
        return decode_graphs.ahead(root, key, run, self.device, self._captured).replay

    def _captured(self, seconds: float) -> None:
        self.graphs_captured += 1
        self.capture_s += seconds

    def _stepped_eagerly(self) -> None:
        self.eager_steps += 1

    def _capture_totals(self) -> tuple[float, int, int]:  # over the decoder's life, in `Calls`' order
        return self.capture_s, self.graphs_captured, self.eager_steps

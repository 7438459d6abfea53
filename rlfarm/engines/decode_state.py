"""The tensors of the static decoder (`rlfarm.engines.static_decoder`): a slot-major KV cache and per-slot
decoding state, allocated once per (slots, cache length) so captured CUDA graphs replay on the same memory.

A slot is one batch row: it holds one sample at a time, from the prompt's prefill (columns [0, P) of its cache
row, P = the call's padded prompt length) to its end, then the next queued sample takes it. Every per-slot
counter (cache column, position, token index) is a tensor of its own, so slots at different points of their
samples decode in one step. The batch may run on a prefix of the slots (an active-batch bucket, `view`): the
prefix of a slot-major tensor is a view of the same memory, so each bucket's graph reads and writes the one cache.
A view may also cut the cache to its first `context` columns (a context bucket): a step then attends only to the
columns written so far, rounded up, instead of the whole allocated row.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch

from rlfarm.engines.noise import column_keys

# fields with a slot (batch) dimension first: what a bucket view slices and what moving a sample copies
PER_SLOT = ("keys", "values", "key_valid", "logits", "logits_version", "next_input", "position", "column", "step",
            "limit", "forced_at", "sample_id", "finished", "tokens", "logprobs", "generated", "versions")
# fields with a cache column as their second-to-last (keys, values) or last (key_valid) dimension: what a context
# bucket cuts
CACHE_COLUMNS = ("keys", "values", "key_valid")


@dataclass
class DecodeState:
    keys: list[torch.Tensor]          # per layer [B, kv_heads, S + 1, D]; column c holds the row's token at column c
    values: list[torch.Tensor]
    cos: torch.Tensor                 # [S, D] rotary table by position
    sin: torch.Tensor
    key_valid: torch.Tensor           # [B, S + 1] bool: columns a query may attend to
    logits: torch.Tensor              # [B, V] the logits the next token is sampled from
    logits_version: torch.Tensor      # [B] the weight version that computed them (partial rollouts)
    next_input: torch.Tensor          # [B] the token fed at the next forward
    position: torch.Tensor            # [B] its position id
    column: torch.Tensor              # [B] the cache column its key/value go to (= P + token index)
    step: torch.Tensor                # [B] index of the next sampled token in its sample
    limit: torch.Tensor               # [B] the sample ends after this many tokens (the cap, or a synthetic length)
    forced_at: torch.Tensor           # [B] token index where the end token is forced (-1: nowhere)
    sample_id: torch.Tensor           # [B] the sample's index in the step: keys its sampling noise (`noise`)
    seed: torch.Tensor                # [] the call's seed
    version: torch.Tensor             # [] the version of the weights loaded now (set between blocks of steps)
    column_keys: torch.Tensor         # [V] the sampling noise's key per vocabulary id (`noise.column_keys`)
    finished: torch.Tensor            # [B] bool: the slot's sample has ended (or the slot is empty)
    tokens: torch.Tensor              # [B, S] sampled tokens by token index (pad after the end)
    logprobs: torch.Tensor            # [B, S] float32
    generated: torch.Tensor           # [B, S] bool: the token was generated before the sample ended
    versions: torch.Tensor            # [B, S] the weight version each token was sampled under (`logits_version`)
    graphs: dict = field(default_factory=dict)  # (bucket, context, Sampling) → torch.cuda.CUDAGraph
    views: dict = field(default_factory=dict)   # (bucket, context) → DecodeState over the first `bucket` slots
    graph_pool: tuple | None = None  # the memory pool all its graphs share (one replays at a time)

    @property
    def slots(self) -> int:
        return self.finished.shape[0]

    @property
    def cache_len(self) -> int:
        return self.tokens.shape[1]

    def view(self, bucket: int, context: int | None = None) -> DecodeState:
        """This state's first `bucket` slots and first `context` cache columns (None: all; views of the same
        memory), made once per (bucket, context) so that a graph captured on it and the eager path see the same
        tensor objects. The whole state's view too: compiled steps see views alone (a view's guards ask for its
        base, which the allocated tensors lack: one compilation serves every bucket only if all are views)."""
        key = (bucket, context or self.cache_len)
        if key not in self.views:
            cut = {name: _prefix(getattr(self, name), bucket) for name in PER_SLOT}
            cut |= {name: _columns(cut[name], key[1]) for name in CACHE_COLUMNS}
            self.views[key] = replace(self, **cut, graphs={}, views={})
        return self.views[key]

    def start(self, rows: torch.Tensor, mask: torch.Tensor, logits: torch.Tensor, limit: torch.Tensor,
              forced_at: torch.Tensor, sample_id: torch.Tensor, pad_id: int) -> None:
        """New samples in `rows` (their prompts' masks [rows, P], already in the cache's first P columns): their
        first token comes from `logits`, their counters start from zero."""
        prompt_len = mask.shape[1]
        self.logits[rows] = logits
        self.logits_version[rows] = self.version
        self.key_valid[rows] = False
        self.key_valid[rows, :prompt_len] = mask.bool()
        self.position[rows] = mask.sum(dim=1)
        self.column[rows] = prompt_len
        self.step[rows] = 0
        self.limit[rows], self.forced_at[rows], self.sample_id[rows] = limit, forced_at, sample_id
        self.finished[rows] = False
        self.tokens[rows] = pad_id
        self.logprobs[rows] = 0.0
        self.generated[rows] = False
        self.versions[rows] = 0

    def move(self, source: list[int], target: list[int]) -> None:
        """Move the samples of slots `source` to the empty slots `target` (a batch shrinking to a bucket)."""
        device = self.finished.device
        src, dst = torch.tensor(source, device=device), torch.tensor(target, device=device)
        for name in PER_SLOT:
            for tensor in _as_list(getattr(self, name)):
                tensor.index_copy_(0, dst, tensor.index_select(0, src))
        self.finished.index_fill_(0, src, True)


def shrink(state: DecodeState, holder: list, started: list, sizes: list[int]) -> None:
    """No sample left to queue: move the running ones to the lowest slots so a smaller bucket holds them. holder:
    slot → the sample it holds (None: free), started: slot → the decode steps run when its sample started (both the
    decoder's, updated here)."""
    active = [slot for slot, sample in enumerate(holder) if sample is not None]
    if not active:
        return
    size = min(size for size in sizes if size >= len(active))
    movers = [slot for slot in active if slot >= size]
    if not movers:
        return
    free = [slot for slot in range(size) if holder[slot] is None][:len(movers)]
    state.move(movers, free)
    for source, target in zip(movers, free):
        holder[target], started[target] = holder[source], started[source]
        holder[source] = None


def _prefix(value, bucket: int):
    return [t[:bucket] for t in value] if isinstance(value, list) else value[:bucket]


def _columns(value, context: int):
    if isinstance(value, list):  # keys, values: [B, kv_heads, S, D]
        return [t[:, :, :context] for t in value]
    return value[:, :context]  # key_valid: [B, S]


def _as_list(value) -> list[torch.Tensor]:
    return value if isinstance(value, list) else [value]


def allocate(slots: int, cache_len: int, layers: int, kv_heads: int, head_dim: int, vocab: int,
             cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype, device: torch.device) -> DecodeState:
    """A fresh state: every slot empty (finished). The cache holds one column more than any view shows, so every
    view a step runs on is a strided slice of it: one torch.compile compilation serves every bucket (a view as
    long as its base would be contiguous, which its guards tell apart)."""
    def zeros(*shape, kind=dtype):
        return torch.zeros(*shape, dtype=kind, device=device)

    cache = (slots, kv_heads, cache_len + 1, head_dim)
    counters = {name: zeros(slots, kind=torch.long) for name in
                ("logits_version", "next_input", "position", "column", "step", "limit", "forced_at",
                 "sample_id")}
    return DecodeState(
        keys=[zeros(*cache) for _ in range(layers)], values=[zeros(*cache) for _ in range(layers)], cos=cos,
        sin=sin, key_valid=zeros(slots, cache_len + 1, kind=torch.bool), logits=zeros(slots, vocab), **counters,
        seed=zeros((), kind=torch.long), version=zeros((), kind=torch.long), column_keys=column_keys(vocab, device),
        finished=torch.ones(slots, dtype=torch.bool, device=device),
        tokens=zeros(slots, cache_len, kind=torch.long), logprobs=zeros(slots, cache_len, kind=torch.float32),
        generated=zeros(slots, cache_len, kind=torch.bool), versions=zeros(slots, cache_len, kind=torch.long))


def mark_dynamic(state: DecodeState) -> None:
    """torch.compile: slots and cache length vary between states and buckets; one compilation serves them all."""
    for item in fields(state):
        if item.name not in PER_SLOT and item.name not in ("cos", "sin"):
            continue
        for tensor in _as_list(getattr(state, item.name)):
            torch._dynamo.maybe_mark_dynamic(tensor, 0)
            if tensor.dim() == 4:
                torch._dynamo.maybe_mark_dynamic(tensor, 2)
            elif tensor.dim() == 2 and item.name not in ("logits", "cos", "sin"):
                torch._dynamo.maybe_mark_dynamic(tensor, 1)

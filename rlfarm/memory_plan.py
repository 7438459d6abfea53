"""The GPU memory an LLM run's roles will hold, from the model's shape and the run's sizes, before anything starts
(issue 37): `rlfarm plan` prints it per role and per GPU, and `rlfarm train` refuses in one line a role whose
estimate is larger than the card the driver sees (`run.memory_check=false` skips the check).

An estimate from formulas, not a measurement (GiB = 2^30 bytes):
- learner state: fp32 weights, fp32 gradients and AdamW's two fp32 moments, 16 B per trained parameter (under LoRA
  4 B per frozen one), over the ranks under FSDP;
- learner work: activations kept for the backward pass, `ACTIVATION_BYTES` × hidden per token and layer (below;
  less for packed pieces and compiled blocks),
  or with activation checkpointing each block's fp32 input per token and one block's activations; the weights in
  bf16 for compute, 2 B per parameter (autocast's copies; under FSDP the root unit and two gathered blocks,
  `rlfarm.data_parallel.shard_model`); the head's logits ×3 in fp32 (logits, log-softmax, their gradient), at most
  `LOGIT_BUDGET` elements at once (the head runs in chunks: `rlfarm.models.lm.ScoringHead`); under FSDP, rank 0's
  whole bf16 copy of the trainable weights that it publishes;
- engine: its weights in the run's dtype, the KV cache (slots × (prompt + cap) tokens × layers × 2 × kv heads ×
  head dim) and one decode step's fp32 logits.
Colocated engines release their KV cache while the learner trains (`EngineRole.sleep`): a GPU's peak is then the
larger of its generate and train phases."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

GIB = 2 ** 30
# Elements of fp32 logits that exist at once where the head runs in chunks (256 MB; `rlfarm.models.lm`): a 7B
# policy's whole step, 256 × 1,280 tokens × a 152k vocabulary, would be ~200 GB. Here so that the plan needs no torch.
LOGIT_BUDGET = 1 << 26
# Activations kept per hidden unit, token and layer by an HF decoder under bf16 autocast, no recomputation: measured,
# not the 34 B of Megatron's fused kernels (Korthikanti et al. 2022). One H200, experiment=grpo_long_tail (1.5B
# shape, 16 rows × 1,058 tokens a micro-batch): the learner's peak was 81.0 GiB, of which state 19.5 and autocast's
# weight copies 2.9; the rest over tokens × hidden × layers is 86 B. Rounded up: an estimate should not promise room.
ACTIVATION_BYTES = 88
# The same for a packed piece (algo.packed: flash varlen, no padded attention mask or scores), eager and with each
# block compiled (algo.compile_layers: inductor saves fewer intermediates for the backward). Measured at the 7B shape
# on 2× H200 (colocated_2, FSDP, 2026-11-30; rank 0's peak less the other terms' estimate): eager 61 B (4,096-token
# pieces), compiled 43 B (4,096) and 46 B (8,192: 49 B a token at the margin). Rounded up with ~15 % to spare: other
# shapes were not measured (the 1.5B's MLP is wider for its hidden size), nor other piece sizes.
PACKED_ACTIVATION_BYTES = {False: 72, True: 52}  # by compile_layers


@dataclass(frozen=True)
class LMShape:
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool

    @property
    def block_params(self) -> int:
        """One decoder block: q, k, v (with biases), o, the gated MLP's three matrices, two norms."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return self.hidden * (q + 2 * kv) + q + 2 * kv + q * self.hidden + 3 * self.hidden * self.intermediate \
            + 2 * self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.block_params + self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * dtype_bytes


def lm_shape(config: Mapping, vocab: int | None = None) -> LMShape:
    """An HF causal-LM config (dict or PretrainedConfig fields); `vocab` overrides its vocabulary (the roles size a
    built model's to the task's tokenizer)."""
    get = config.get if isinstance(config, Mapping) else lambda key, default=None: getattr(config, key, default)
    heads = int(get("num_attention_heads"))
    return LMShape(vocab=int(vocab or get("vocab_size")), hidden=int(get("hidden_size")),
                   intermediate=int(get("intermediate_size")), layers=int(get("num_hidden_layers")), heads=heads,
                   kv_heads=int(get("num_key_value_heads") or heads),
                   head_dim=int(get("head_dim") or int(get("hidden_size")) // heads),
                   tied=bool(get("tie_word_embeddings", False)))


def learner_bytes(shape: LMShape, *, ranks: int, fsdp: bool, tokens: int, lora_params: int = 0,
                  recompute: bool = False, packed: bool = False, compiled: bool = False) -> dict[str, float]:
    """One learner rank's terms (bytes): state, activations, autocast, logits, gathered; `tokens` of one
    micro-batch. `recompute` (activation checkpointing): each block keeps only its fp32 input, and one block's
    activations exist at once, while it is recomputed. `packed` pieces keep less per token, compiled blocks
    (`compiled`, counted only where packed: the padded path's is not measured) less again."""
    shards = ranks if fsdp else 1
    state = (4 * shape.params + 16 * lora_params) if lora_params else 16 * shape.params
    logits = min(tokens * shape.vocab, LOGIT_BUDGET)  # the head runs in chunks (rlfarm.models.lm.ScoringHead)
    per_token = PACKED_ACTIVATION_BYTES[compiled] if packed else ACTIVATION_BYTES
    per_layer = per_token * shape.hidden * tokens
    activations = (4 * shape.hidden * tokens * shape.layers + per_layer) if recompute else per_layer * shape.layers
    sharded = fsdp and ranks > 1
    # bf16 weights in compute: autocast's casts of the whole model on one rank; under FSDP's mixed precision the
    # root unit (embeddings, head) gathered in bf16 for the whole pass, and two blocks (one prefetched)
    outside_blocks = shape.params - shape.layers * shape.block_params
    return {"state": state / shards, "activations": activations,
            "autocast": 2 * (outside_blocks if sharded else shape.params), "logits": 3 * 4 * logits,
            # ... and the root unit's fp32 gradients, whole until its reduce-scatter ends the backward pass
            "gathered": 2 * 2 * shape.block_params + 4 * outside_blocks if sharded else 0,
            # under FSDP rank 0 keeps the whole trainable weights, gathered in bf16, to publish (counted on each rank)
            "publish_copy": 2 * (lora_params or shape.params) if fsdp and ranks > 1 else 0}


def engine_bytes(shape: LMShape, *, slots: int, cache_tokens: int, dtype_bytes: int) -> dict[str, float]:
    """One engine's terms (bytes): weights, kv_cache, logits."""
    cache = slots * cache_tokens * shape.kv_bytes_per_token(dtype_bytes)
    return {"weights": dtype_bytes * shape.params, "kv_cache": cache, "logits": 4 * slots * shape.vocab}


def describe(terms: Mapping[str, float]) -> str:
    """'12.3 GiB = state 10.0 + activations 2.3' (terms under 0.05 GiB left out)."""
    shown = " + ".join(f"{name.replace('_', ' ')} {value / GIB:.1f}" for name, value in terms.items()
                       if value >= 0.05 * GIB)
    return f"{sum(terms.values()) / GIB:.1f} GiB" + (f" = {shown}" if shown else "")


def gpu_peaks(roles: Iterable[tuple[str, tuple, Mapping[str, float]]]) -> dict[tuple, float]:
    """Per GPU (any hashable key: node and GPU id), the peak bytes of the roles on it: (role kind, gpu, terms).
    Where a learner shares the GPU, its engines' KV caches are released while it trains: max(generate, train)."""
    on: dict[tuple, list] = {}
    for kind, gpu, terms in roles:
        on.setdefault(gpu, []).append((kind, terms))
    peaks = {}
    for gpu, held in on.items():
        engines = [terms for kind, terms in held if kind == "engine"]
        learners = [terms for kind, terms in held if kind == "learner"]
        resident = sum(t["weights"] for t in engines) + sum(t["state"] + t["gathered"] + t.get("publish_copy", 0)
                                                            for t in learners)
        generate = resident + sum(t["kv_cache"] + t["logits"] for t in engines)
        train = resident + sum(t["activations"] + t["autocast"] + t["logits"] for t in learners)
        peaks[gpu] = max(generate, train) if learners else generate
    return peaks


def measured_peak_gib(device: str) -> float | None:
    """The most memory this process's tensors held on its CUDA device since the last call (GiB; None on a CPU):
    the measurement an estimate here is checked against."""
    import torch

    if torch.device(device).type != "cuda":
        return None
    peak = torch.cuda.max_memory_allocated(device) / GIB
    torch.cuda.reset_peak_memory_stats(device)
    return peak

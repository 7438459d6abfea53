"""`rlfarm bench lm_learner`: the LLM learner's update (issue 37) — GRPO's `update_policy`, as the learner role
runs it (fp32 weights and AdamW (fused on CUDA), bf16 autocast on CUDA, the head in chunks), on a synthetic step: `rows` samples of
random tokens, `prompt_len`-token prompts and responses of lengths drawn uniformly in [cap/4, cap], right-padded.

Rows:
- `matmul nN` (the baseline): an N × N × N product in the run's dtype, TFLOP/s — what this card reaches at best;
- `lm update (rows)`: micro-batches of `micro_batch_size` rows, every column of the step (the padding computed);
- `lm update (tokens)`, where `micro_batch_tokens` is set: pieces of at most that many tokens, rows sorted by length
  and each piece cut to its own columns (`rlfarm.algos.micro_batches.token_pieces`), on the same step;
- `lm update (packed)`, where `micro_batch_tokens` is set: the same, each piece's rows' real tokens packed into one
  sequence (`algo.packed`, `rlfarm.models.packed`: no padding computed, flash varlen attention on CUDA);
- `lm update (packed, compiled)`, where `compile_layers` is set too: the same, each decoder block torch.compiled
  (`algo.compile_layers`, `rlfarm.models.compiled`: inductor on CUDA, aot_eager on CPU). It runs last (the blocks
  stay compiled); `compile_s` is its untimed first update less a timed one (the compilation, apart from the timing),
  `compiles` the graphs dynamo compiled in all its updates (one per entry: a recompile per piece would show here).
Each update row: model TFLOP/s (6·N·T over the real tokens, `rlfarm.algos.model_flops`; padding and the loss's own
work are what it loses), `ratio` = that over the matmul's, `mfu` over the card's dense bf16 peak (`rlfarm.cards`),
tokens/s, and on CUDA `peak_gib` (the update's peak memory) beside `estimate_gib`, the learner's estimate from
`rlfarm.memory_plan` for the same sizes (what `rlfarm plan` prints and `rlfarm train` checks).
`activation_checkpointing: true` recomputes each block's activations (model FLOPs still count 6·N·T).
"""
from __future__ import annotations

import dataclasses
import logging
import time

import torch
from omegaconf import DictConfig

from rlfarm.algos.grpo_lm import GRPOConfig, policy_optimizer, update_policy
from rlfarm.algos.model_flops import UpdateFigures, compiled_graphs
from rlfarm.bench.common import sizes, synchronize, use_cpu_threads
from rlfarm.bench.engine import model_shape
from rlfarm.data import Rollout
from rlfarm.memory_plan import GIB, learner_bytes, lm_shape, measured_peak_gib
from rlfarm.models.lm import causal_lm, compute_dtype

log = logging.getLogger("rlfarm")
UPDATE = "lm update"


def run(cfg: DictConfig, device: str) -> list[dict]:
    size = sizes(cfg, device)
    use_cpu_threads(cfg, device)
    torch.manual_seed(int(cfg.seed))
    shape = model_shape(cfg.get("shape"), size.model)
    recompute = bool(size.get("activation_checkpointing", False))
    with torch.device(device):
        model = causal_lm(shape, recompute=recompute)  # fp32 weights, as the learner role holds them
    dtype = compute_dtype(str(cfg.dtype), device)
    rows, prompt_len, cap = int(size.rows), int(size.prompt_len), int(size.response_len)
    rollout = synthetic_step(rows, prompt_len, cap, int(shape["vocab_size"]), int(cfg.seed), device)
    algo = GRPOConfig(prompts_per_step=rows, group_size=1, micro_batch_size=int(size.micro_batch_size), lr=1e-6,
                      device=device)
    optimizer = policy_optimizer(model, algo.lr, device)
    advantages = torch.randn(rows, generator=torch.Generator().manual_seed(int(cfg.seed))).to(device)
    n = int(size.matmul)
    out = [{"case": f"matmul n{n}", "value": matmul_tflops(n, dtype, device), "unit": "TFLOP/s", "baseline": None}]
    forms = {"rows": algo}
    if size.get("micro_batch_tokens"):
        forms["tokens"] = dataclasses.replace(algo, micro_batch_size=None,
                                              micro_batch_tokens=int(size.micro_batch_tokens))
        forms["packed"] = dataclasses.replace(forms["tokens"], packed=True)
        if size.get("compile_layers"):
            forms["packed, compiled"] = dataclasses.replace(forms["packed"], compile_layers=True)
    for form, settings in forms.items():
        graphs = compiled_graphs()
        seconds, measured = timed_update(model, optimizer, rollout, advantages, settings, dtype, int(size.repeats))
        micro_tokens = (settings.micro_batch_tokens or settings.micro_batch_size * (prompt_len + cap))
        estimate = learner_bytes(lm_shape(shape), ranks=1, fsdp=False, tokens=micro_tokens, recompute=recompute,
                                 packed=settings.packed, compiled=settings.compile_layers)
        tokens = int(rollout.attention_mask().sum())
        row = {"case": f"{UPDATE} ({form})", "value": measured["learner_tflops"], "unit": "TFLOP/s",
               "baseline": out[0]["case"], "mfu": measured["mfu"], "tokens_per_s": round(tokens / seconds),
               "update_s": round(seconds, 4), "rows": rows, "micro_batch_size": settings.micro_batch_size,
               "micro_batch_tokens": settings.micro_batch_tokens, "packed": settings.packed,
               "activation_checkpointing": recompute, "compile_layers": settings.compile_layers,
               "real_tokens": tokens, "padded_tokens": rows * (prompt_len + cap),
               "peak_gib": None if measured["learner_peak_gib"] is None else round(measured["learner_peak_gib"], 2),
               "estimate_gib": round(sum(estimate.values()) / GIB, 2),
               "timed_compiles": measured["learner_compiles"], "alloc_retries": measured["learner_alloc_retries"]}
        if settings.compile_layers:
            row |= {"compile_s": round(measured["warmup_s"] - seconds, 3), "compiles": compiled_graphs() - graphs}
        log.info("%s: %.3g TFLOP/s of model FLOPs (%s), %.2f s an update, peak %s GiB (estimate %s)", row["case"],
                 row["value"], "MFU n/a" if row["mfu"] is None else f"MFU {100 * row['mfu']:.1f} %", seconds,
                 row["peak_gib"], row["estimate_gib"])
        out.append(row)
    return out


def timed_update(model: torch.nn.Module, optimizer: torch.optim.Optimizer, rollout: Rollout,
                 advantages: torch.Tensor, algo: GRPOConfig, dtype: torch.dtype, repeats: int) -> tuple[float, dict]:
    """The median of `repeats` updates' seconds (after one untimed: the allocator, cuBLAS and autocast's caches
    settle, compiled blocks compile), and the model FLOPs, MFU and peak memory of the timed ones, and the untimed
    update's seconds (`warmup_s`)."""
    device = algo.device

    def update() -> float:
        synchronize(device)
        started = time.perf_counter()
        update_policy(model, optimizer, rollout, advantages, algo, compute_dtype=dtype)
        synchronize(device)
        return time.perf_counter() - started

    warmup = update()
    measured_peak_gib(device)  # reads and resets the peak: `figures.of` below reads the timed updates' own
    figures = UpdateFigures(model, device)  # its compile and allocator-retry counts start here: the timed updates'
    seconds = sorted(update() for _ in range(repeats))[repeats // 2]
    return seconds, figures.of(int(rollout.attention_mask().sum()), seconds) | {"warmup_s": warmup}


def synthetic_step(rows: int, prompt_len: int, cap: int, vocab: int, seed: int, device: str) -> Rollout:
    """`rows` samples: full prompts of random tokens, responses of lengths uniform in [cap/4, cap], right-padded."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(1, cap // 4), cap + 1, (rows,), generator=generator)
    response_mask = (torch.arange(cap)[None] < lengths[:, None]).long()
    response = torch.randint(1, vocab, (rows, cap), generator=generator) * response_mask
    prompt = torch.randint(1, vocab, (rows, prompt_len), generator=generator)
    on = lambda tensor: tensor.to(device)  # noqa: E731
    return Rollout(prompt_ids=on(prompt), prompt_mask=on(torch.ones_like(prompt)), response_ids=on(response),
                   response_mask=on(response_mask), logprobs=on(-torch.rand(rows, cap, generator=generator)),
                   group_size=1, temperature=1.0, weight_version=0)


def matmul_tflops(n: int, dtype: torch.dtype, device: str, repeats: int = 10) -> float:
    """TFLOP/s of an n × n × n product in `dtype`, the median of `repeats` after one warm-up."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    times = []
    for i in range(repeats + 1):
        synchronize(device)
        started = time.perf_counter()
        a @ b
        synchronize(device)
        if i:
            times.append(time.perf_counter() - started)
    return 2 * n ** 3 / sorted(times)[len(times) // 2] / 1e12

"""`rlfarm bench engine`'s long-tail cases (issue 35): continuous refill against the fixed batch, and the decode
step against the HBM bound.

Long tail: `prompts` random prompts of `prompt_len` tokens, `samples_per_prompt` samples each (a GRPO group; 1 by
default), at most `slots` decoded at once, up to
`cap` new tokens; each sample ends at a length drawn by the synthetic length model (`lengths`, log-normal:
median and p99 as fractions of the cap, on its end token, the last id of the vocabulary) — a SPEED-RUN setting:
random weights never end on their own. Same prompts, same seed, same run, two engines:
- `long-tail fixed batch`: the slots decode in waves, each until its longest sample ends (the engine before
  refill);
- `long-tail refill`: a finished row takes the next prompt at the next check (`stop_check_every` steps); a
  prompt runs once per call, its later samples start from a copy (`rlfarm.engines.prompt_donors`); with
  `prompts_rerun` the same beside it with every fill running its prompts again (`long-tail refill prompts run
  again`; the refill row's `vs_rerun` is their ratio). Each row counts its `prefills`, `prompt_forwards` and
  `prompt_copies`.
value = USEFUL tokens/s: tokens of samples (end token included, no padding, no rows decoded after their end),
over the wall time of the whole call (prefills included). Both make the same samples (same seed), so the useful
tokens are equal and the ratio is one of times. `useful_frac` = useful tokens / (decode steps × slots).

Decode step: the fixed batch at `slots` rows, every row to the cap (no lengths), decode ms/step = (time of the
call − time of a one-token call) / (cap − 1), measured in the same run attending to context buckets
(`context_step` columns apart: the engine's default) and to the whole allocated row (`decode step bN whole row`,
its baseline: the engine before them), and with `unfused_step` the default step with a GEMM per projection
(`decode step bN unfused`: q, k, v, gate and up each their own, as before `rlfarm.engines.fused_projections`;
the first row's `vs_unfused` = unfused ms / its ms). Beside each, the floors of that step
(`rlfarm.bench.engine_roofline`):
`hbm_bound_ms` (weights + KV cache at the mean context P + cap/2 over the card's bandwidth), `compute_bound_ms`
(its matrix FLOPs over the card's dense bf16 peak), `roofline_ms` = the larger, `serial_bound_ms` (GEMMs, then
attention, each at its own limit); `of_hbm_bound` = HBM bound / measured (the issue's target: ≥ 0.6 at 7B, b256)
and `of_roofline` = roofline / measured (1.0 = no step could be faster).
"""
from __future__ import annotations

import logging
import time

import torch
from omegaconf import DictConfig

from rlfarm.bench.common import synchronize
from rlfarm.bench.engine_profile import profile_decode_step
from rlfarm.bench.engine_roofline import bounds, step_cost
from rlfarm.cards import DENSE_TFLOPS, HBM_TB_S, card_figure
from rlfarm.engines.hf import HFEngine
from rlfarm.engines.synthetic_lengths import synthetic_lengths

log = logging.getLogger("rlfarm")
FIXED, REFILL, STEP = "long-tail fixed batch", "long-tail refill", "decode step"
WHOLE_ROW, MATMUL, UNFUSED = "whole row", "matmul attention", "unfused"
RERUN = "prompts run again"  # refill without prompt donors: a group's later samples run their prompt again


def timed(work, device: str) -> tuple[float, object]:
    synchronize(device)
    started = time.perf_counter()
    result = work()
    synchronize(device)
    return time.perf_counter() - started, result


def run_long_tail(model: torch.nn.Module, cfg: DictConfig, device: str, seed: int, vocab: int,
                  profile_steps: int = 0, unfused_step: bool = False) -> list[dict]:
    """The two long-tail rows (refill's baseline: the fixed batch) and the decode-step rows (with `profile_steps`
    > 0: the kernel profile of the first, `rlfarm.bench.engine_profile`; with `unfused_step`: one with the
    projections unfused)."""
    slots, prompts, prompt_len, cap = int(cfg.slots), int(cfg.prompts), int(cfg.prompt_len), int(cfg.cap)
    n = int(cfg.get("samples_per_prompt", 1))
    lengths = synthetic_lengths(cfg.lengths)
    ids = torch.randint(1, vocab - 1, (prompts, prompt_len), generator=torch.Generator().manual_seed(seed)).tolist()
    end = vocab - 1
    common = {"unit": "useful tok/s", "slots": slots, "prompts": prompts, "samples_per_prompt": n,
              "prompt_len": prompt_len, "cap": cap,
              "lengths": f"synthetic (speed run): median {lengths.median_frac:.3g}·cap, "
                         f"p99 {lengths.p99_frac:.3g}·cap"}
    # one engine for every case (one compilation, one cache); its mode is set per case
    engine = HFEngine(model, pad_id=0, device=device, seed=seed, max_batch=slots,
                      stop_check_every=int(cfg.stop_check_every))
    context_step = cfg.get("context_step")
    engine._static.context_step = int(context_step) if context_step else None
    rows = []
    # on CUDA the steps attend through the per-row kernel (rlfarm.engines.decode_attention); the same cases through
    # the masked matmuls it replaced (MATMUL rows) show what it adds
    kernel = engine._static.row_kernel
    cases = [(FIXED, False, "auto", True), (REFILL, True, "auto", True)]
    cases += [(f"{REFILL} {MATMUL}", True, "matmul", True)] if kernel else []
    cases += [(f"{REFILL} {RERUN}", True, "auto", False)] if cfg.get("prompts_rerun") else []
    for case, refill, attention, share in cases:
        engine.refill, engine.lengths, engine._static.attention = refill, lengths, attention
        engine._static.share_prompts = share
        engine.generate(ids[:slots], 1, min(cap, 64), eos_id=end)  # warm-up: compile, cuBLAS, the allocator
        engine.prepare(prompts, n, prompt_len, cap, eos_id=end)  # the timed call's graphs, captured ahead
        engine.reseed(seed)
        seconds, rollout = timed(lambda: engine.generate(ids, n, cap, eos_id=end), device)
        useful = int(rollout.response_mask.sum())
        calls = engine.last_call
        rows.append({"case": case, "value": useful / seconds, "baseline": FIXED if refill else None, **common,
                     "seconds": round(seconds, 3), "useful_tokens": useful, "decode_steps": calls.decode_steps,
                     "useful_frac": round(useful / (calls.decode_steps * slots), 3), "prefills": calls.prefills,
                     "prompt_forwards": calls.prompt_forwards, "prompt_copies": calls.prompt_copies})
        log.info("%s: %.0f useful tok/s (%d decode steps)", case, useful / seconds, calls.decode_steps)
    by_case = {row["case"]: row for row in rows}
    if f"{REFILL} {RERUN}" in by_case:
        by_case[REFILL]["vs_rerun"] = round(by_case[REFILL]["value"] / by_case[f"{REFILL} {RERUN}"]["value"], 3)
    engine._static.share_prompts = True
    engine.refill, engine.lengths = False, None  # every row to the cap: the decode step at full batch
    step, buckets_on = f"{STEP} b{slots}", engine._static.context_step
    # (case, context step, attention, fused projections); the engine's default first, its whole-row baseline last
    steps = ([(step, buckets_on, "auto", True)]
             + ([(f"{step} {MATMUL}", buckets_on, "matmul", True)] if kernel else [])
             + ([(f"{step} {UNFUSED}", buckets_on, "auto", False)] if unfused_step else [])
             + [(f"{step} {WHOLE_ROW}", None, "matmul", True)])
    step_rows, batch = {}, (ids * -(-slots // len(ids)))[:slots]  # a full batch of prompts, repeated if few
    for case, context_step, attention, fused in steps:
        engine._static.context_step, engine._static.attention = context_step, attention
        engine._static.projections.switch(fused)  # a graph per path: the fused one's are kept for the rows after
        step_rows[case] = decode_step_row(engine, model, cfg, device, batch, case)
    first, whole = step_rows[step], step_rows[f"{step} {WHOLE_ROW}"]
    first |= {"baseline": whole["case"], "speedup": round(whole["value"] / first["value"], 3)}
    for name, key in ((MATMUL, "vs_matmul"), (UNFUSED, "vs_unfused")):
        if f"{step} {name}" in step_rows:
            first[key] = round(step_rows[f"{step} {name}"]["value"] / first["value"], 3)
    engine._static.context_step, engine._static.attention = buckets_on, "auto"
    engine._static.projections.switch(True)
    if profile_steps:
        first |= profile_decode_step(engine, slots, prompt_len, cap, device, profile_steps)
    return rows + list(step_rows.values())


def decode_step_row(engine: HFEngine, model: torch.nn.Module, cfg: DictConfig, device: str,
                    ids: list[list[int]], case: str) -> dict:
    slots, prompt_len, cap = len(ids), int(cfg.prompt_len), int(cfg.cap)
    engine.prepare(slots, 1, prompt_len, cap)
    engine.prepare(slots, 1, prompt_len, 1)
    engine.generate(ids, 1, min(cap, 64))  # untimed: the first call of a path pays cuBLAS' and the allocator's set-up
    full, _ = timed(lambda: engine.generate(ids, 1, cap), device)
    attended = engine.last_call.mean_context
    one, _ = timed(lambda: engine.generate(ids, 1, 1), device)
    step_ms = 1e3 * (full - one) / max(cap - 1, 1)
    cost = step_cost(model, slots, prompt_len + cap / 2)
    tb_s = card_figure(HBM_TB_S, device, cfg.get("hbm_tb_s"))
    tflops = card_figure(DENSE_TFLOPS, device, cfg.get("peak_tflops"))
    row = {"case": case, "value": round(step_ms, 3), "unit": "ms/step", "baseline": None, "prompt_len": prompt_len,
           "cap": cap, "attended_columns": round(attended, 1), "weights_gb": round(cost["weight_bytes"] / 1e9, 2),
           "kv_gb": round(cost["kv_bytes"] / 1e9, 2),
           "tflop": round((cost["gemm_flops"] + cost["attention_flops"]) / 1e12, 3), "hbm_tb_s": tb_s,
           "peak_tflops": tflops, "fused_projections": engine._static.projections.fuse}
    floors = bounds(cost, tb_s, tflops)
    row |= {name: round(ms, 3) for name, ms in floors.items()}
    if "hbm_bound_ms" in floors:
        row["of_hbm_bound"] = round(floors["hbm_bound_ms"] / step_ms, 3)
    if "roofline_ms" in floors:
        row["of_roofline"] = round(floors["roofline_ms"] / step_ms, 3)
    log.info("%s: %.2f ms/step (HBM bound %s ms, roofline %s ms)", case, step_ms, row.get("hbm_bound_ms"),
             row.get("roofline_ms"))
    return row

"""`rlfarm bench engine`'s long-tail cases (issue 35): continuous refill against the fixed batch, and the decode
step against the HBM bound.

Long tail: `prompts` random prompts of `prompt_len` tokens, one sample each, at most `slots` decoded at once, up to
`cap` new tokens; each sample ends at a length drawn by the synthetic length model (`lengths`, log-normal:
median and p99 as fractions of the cap, on its end token, the last id of the vocabulary) — a SPEED-RUN setting:
random weights never end on their own. Same prompts, same seed, same run, two engines:
- `long-tail fixed batch`: the slots decode in waves, each until its longest sample ends (the engine before
  refill);
- `long-tail refill`: a finished row takes the next prompt at the next check (`stop_check_every` steps).
value = USEFUL tokens/s: tokens of samples (end token included, no padding, no rows decoded after their end),
over the wall time of the whole call (prefills included). Both make the same samples (same seed), so the useful
tokens are equal and the ratio is one of times. `useful_frac` = useful tokens / (decode steps × slots).

Decode step: the fixed batch at `slots` rows, every row to the cap (no lengths), decode ms/step = (time of the
call − time of a one-token call) / (cap − 1), next to the HBM bound of that step: the bytes a step must read
(weights, minus the input embedding unless the head shares it, plus the KV cache of every row at the mean context
P + cap/2) over the card's bandwidth (`HBM_TB_S` by device name, or `hbm_tb_s` in the config).
`of_hbm_bound` = bound / measured (1.0 = at the bound).
"""
from __future__ import annotations

import logging
import time

import torch
from omegaconf import DictConfig

from rlfarm.bench.common import synchronize
from rlfarm.bench.engine_profile import profile_decode_step
from rlfarm.engines.hf import HFEngine
from rlfarm.engines.synthetic_lengths import synthetic_lengths

log = logging.getLogger("rlfarm")
FIXED, REFILL, STEP = "long-tail fixed batch", "long-tail refill", "decode step"
# peak HBM bandwidth by device name (TB/s), first match wins: the vendors' datasheet figures
HBM_TB_S = (("H200", 4.8), ("H100 NVL", 3.9), ("H100 PCIe", 2.0), ("H100", 3.35), ("GH200", 4.0),
            ("A100-SXM4-80GB", 2.039), ("A100 80GB PCIe", 1.935), ("A100", 1.555), ("L40S", 0.864))


def hbm_tb_s(device: str, configured) -> float | None:
    """The card's bandwidth: the configured value, else the table's entry for this device's name."""
    if configured is not None:
        return float(configured)
    if device != "cuda":
        return None
    name = torch.cuda.get_device_name()
    return next((value for key, value in HBM_TB_S if key in name), None)


def step_bytes(model: torch.nn.Module, batch: int, context: float) -> tuple[float, float]:
    """(weight bytes, KV-cache bytes) one decode step reads at `batch` rows of mean `context` tokens."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    embedding = model.get_input_embeddings().weight
    if embedding is not model.get_output_embeddings().weight:  # untied: a step reads `batch` rows of it, not all
        weights -= embedding.numel() * embedding.element_size()
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * embedding.element_size()
    return float(weights), float(batch * context * per_token)


def timed(work, device: str) -> tuple[float, object]:
    synchronize(device)
    started = time.perf_counter()
    result = work()
    synchronize(device)
    return time.perf_counter() - started, result


def run_long_tail(model: torch.nn.Module, cfg: DictConfig, device: str, seed: int, vocab: int,
                  profile_steps: int = 0) -> list[dict]:
    """The two long-tail rows (refill's baseline: the fixed batch) and the decode-step row (with `profile_steps`
    > 0: its kernel profile, `rlfarm.bench.engine_profile`)."""
    slots, prompts, prompt_len, cap = int(cfg.slots), int(cfg.prompts), int(cfg.prompt_len), int(cfg.cap)
    lengths = synthetic_lengths(cfg.lengths)
    ids = torch.randint(1, vocab - 1, (prompts, prompt_len), generator=torch.Generator().manual_seed(seed)).tolist()
    end = vocab - 1
    common = {"unit": "useful tok/s", "slots": slots, "prompts": prompts, "prompt_len": prompt_len, "cap": cap,
              "lengths": f"synthetic (speed run): median {lengths.median_frac:.3g}·cap, "
                         f"p99 {lengths.p99_frac:.3g}·cap"}
    # one engine for every case (one compilation, one cache); its mode is set per case
    engine = HFEngine(model, pad_id=0, device=device, seed=seed, max_batch=slots,
                      stop_check_every=int(cfg.stop_check_every))
    rows = []
    for case, refill in ((FIXED, False), (REFILL, True)):
        engine.refill, engine.lengths = refill, lengths
        engine.generate(ids[:slots], 1, min(cap, 64), eos_id=end)  # warm-up: compile, cuBLAS, the allocator
        engine.prepare(prompts, 1, prompt_len, cap, eos_id=end)  # the timed call's graphs, captured ahead
        engine.reseed(seed)
        seconds, rollout = timed(lambda: engine.generate(ids, 1, cap, eos_id=end), device)
        useful = int(rollout.response_mask.sum())
        calls = engine.last_call
        rows.append({"case": case, "value": useful / seconds, "baseline": FIXED if refill else None, **common,
                     "seconds": round(seconds, 3), "useful_tokens": useful, "decode_steps": calls.decode_steps,
                     "useful_frac": round(useful / (calls.decode_steps * slots), 3)})
        log.info("%s: %.0f useful tok/s (%d decode steps)", case, useful / seconds, calls.decode_steps)
    engine.refill, engine.lengths = False, None  # every row to the cap: the decode step at full batch
    rows.append(decode_step_row(engine, model, cfg, device, ids[:slots]))
    if profile_steps:
        rows[-1] |= profile_decode_step(engine, slots, prompt_len, cap, device, profile_steps)
    return rows


def decode_step_row(engine: HFEngine, model: torch.nn.Module, cfg: DictConfig, device: str,
                    ids: list[list[int]]) -> dict:
    slots, prompt_len, cap = len(ids), int(cfg.prompt_len), int(cfg.cap)
    engine.prepare(slots, 1, prompt_len, cap)
    engine.prepare(slots, 1, prompt_len, 1)
    full, _ = timed(lambda: engine.generate(ids, 1, cap), device)
    one, _ = timed(lambda: engine.generate(ids, 1, 1), device)
    step_ms = 1e3 * (full - one) / max(cap - 1, 1)
    weights, kv = step_bytes(model, slots, prompt_len + cap / 2)
    row = {"case": f"{STEP} b{slots}", "value": round(step_ms, 3), "unit": "ms/step", "baseline": None,
           "prompt_len": prompt_len, "cap": cap, "weights_gb": round(weights / 1e9, 2), "kv_gb": round(kv / 1e9, 2)}
    bandwidth = hbm_tb_s(device, cfg.get("hbm_tb_s"))
    if bandwidth:
        bound_ms = 1e3 * (weights + kv) / (bandwidth * 1e12)
        row |= {"hbm_tb_s": bandwidth, "hbm_bound_ms": round(bound_ms, 3), "of_hbm_bound": round(bound_ms / step_ms, 3)}
    log.info("%s: %.2f ms/step (HBM bound %s ms)", row["case"], step_ms, row.get("hbm_bound_ms"))
    return row

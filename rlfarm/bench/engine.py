"""`rlfarm bench engine` (issue 4, P4): tokens/s of the built-in engine against Hugging Face `generate`.

One model (a Qwen2.5-0.5B-shaped Qwen2 with random weights, bf16 on CUDA), prompts of `prompt_len` random
tokens, `new_tokens` sampled per row (temperature 1, no top-k/top-p, no end of sequence, so every row runs
the full length), at each batch size, measured three ways in one run:
- `hf generate`: plain `model.generate` (dynamic cache, eager);
- `hf static+compile`: `model.generate(cache_implementation="static")`, which compiles the forward
  (mode reduce-overhead) itself; timed after an untimed call of the same shape;
- `rlfarm engine`: `HFEngine.generate` (static KV cache, CUDA-graphed decode step), and with
  `compile_batches` also `rlfarm engine+compile` (the step compiled by torch.compile before capture).
tokens/s = batch × new_tokens / wall time of the whole call (prefill included). Each rlfarm row also
carries `prefill_s` (a call with one new token) and `decode_ms_per_step`, the rest spread over the steps,
so a gap to the target can be read as prefill or decode.
"""
from __future__ import annotations

import gc

import torch
from omegaconf import DictConfig, OmegaConf

from rlfarm.bench.common import median_rate, sizes
from rlfarm.engines.hf import HFEngine
from rlfarm.models.lm import build_causal_lm

PLAIN, STATIC, OURS, OURS_COMPILED = "hf generate", "hf static+compile", "rlfarm engine", "rlfarm engine+compile"


def run(cfg: DictConfig, device: str) -> list[dict]:
    size = sizes(cfg, device)
    dtype = getattr(torch, str(cfg.dtype)) if device == "cuda" else torch.float32
    torch.manual_seed(int(cfg.seed))
    model = build_causal_lm(OmegaConf.to_container(size.model, resolve=True)).to(device=device, dtype=dtype).eval()
    model.generation_config.eos_token_id = None  # every row runs the full length, in every method
    model.generation_config.pad_token_id = 0
    vocab = int(size.model.vocab_size)
    new_tokens, prompt_len, repeats = int(size.new_tokens), int(size.prompt_len), int(size.repeats)
    engines = {OURS: HFEngine(model, pad_id=0, device=device, seed=int(cfg.seed))}
    if size.compile_batches:
        engines[OURS_COMPILED] = HFEngine(model, pad_id=0, device=device, seed=int(cfg.seed), compile=True)
    rows: list[dict] = []
    for batch in size.batches:
        batch = int(batch)
        prompts = torch.randint(1, vocab, (batch, prompt_len), generator=torch.Generator().manual_seed(batch))
        tokens = batch * new_tokens
        common = {"unit": "tok/s", "batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens}
        plain_case, static_case = f"{PLAIN} b{batch}", f"{STATIC} b{batch}"
        plain = hf_generate_rate(model, prompts, new_tokens, device, int(size.baseline_repeats), static=False)
        rows.append({"case": plain_case, "value": plain, "baseline": None, **common})
        if size.static_baseline:
            static = hf_generate_rate(model, prompts, new_tokens, device, int(size.baseline_repeats), static=True)
            rows.append({"case": static_case, "value": static, "baseline": plain_case, **common})
        for name, engine in engines.items():
            if name == OURS_COMPILED and batch not in size.compile_batches:
                continue
            prompt_ids = prompts.tolist()
            generate = lambda steps: engine.generate(prompt_ids, n=1, max_new_tokens=steps, temperature=1.0)  # noqa: E731
            rate = median_rate(lambda: generate(new_tokens), tokens, device, repeats=repeats, warmup=1)
            prefill_s = 1.0 / median_rate(lambda: generate(1), 1, device, repeats=repeats, warmup=1)
            row = {"case": f"{name} b{batch}", "value": rate, "baseline": plain_case, **common,
                   "prefill_s": round(prefill_s, 4),
                   "decode_ms_per_step": round(1e3 * (tokens / rate - prefill_s) / max(new_tokens - 1, 1), 3)}
            if size.static_baseline:
                row["vs_static_compile"] = round(rate / rows_value(rows, static_case), 2)
            rows.append(row)
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def hf_generate_rate(model, prompts: torch.Tensor, new_tokens: int, device: str, repeats: int,
                     static: bool) -> float:
    """Tokens/s of `model.generate` sampling `new_tokens` per row. The static-cache path compiles per shape,
    so its warm-up is a full call of the same shape; plain generate needs only a short one."""
    ids = prompts.to(device)
    mask = torch.ones_like(ids)
    options = {"cache_implementation": "static"} if static else {}

    def generate(steps: int):
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps, min_new_tokens=steps,
                                 do_sample=True, temperature=1.0, top_k=0, top_p=1.0, **options)
        if out.shape[1] != ids.shape[1] + steps:
            raise RuntimeError(f"generate returned {out.shape[1] - ids.shape[1]} new tokens, not {steps}")

    generate(new_tokens if static else 2)
    return median_rate(lambda: generate(new_tokens), ids.shape[0] * new_tokens, device, repeats=repeats, warmup=0)


def rows_value(rows: list[dict], case: str) -> float:
    return next(float(row["value"]) for row in rows if row["case"] == case)

"""`rlfarm bench engine` (issue 4, P4): tokens/s of the built-in engine against Hugging Face `generate`.

One model (a Qwen2.5-0.5B-shaped Qwen2 with random weights, bf16 on CUDA), prompts of `prompt_len` random
tokens, `new_tokens` sampled per row (temperature 1, no top-k/top-p, no end of sequence, so every row runs
the full length), at each batch size, measured three ways in one run:
- `hf generate`: plain `model.generate` (dynamic cache, eager);
- `hf static+compile`: `model.generate(cache_implementation="static")`, which compiles the forward
  (mode reduce-overhead) itself; timed after an untimed call of the same shape;
- `rlfarm engine`: `HFEngine.generate` as it runs by default (static KV cache; on CUDA the decode step
  compiled by torch.compile, one compilation for every batch, and captured in a CUDA graph), and on CUDA
  `rlfarm engine graphs only` (the same without compile).
tokens/s = batch × new_tokens / wall time of the whole call (prefill included). Each rlfarm row also
carries `prefill_s` (a call with one new token) and `decode_ms_per_step`, the rest spread over the steps,
so a gap to the target can be read as prefill or decode.

`shape` (a conf/model name, e.g. qwen2_5_7b_shape) replaces `sizes.model` with that file's config, vocabulary
included. `sizes.long_tail` adds the long-tail cases — continuous refill against the fixed batch in useful
tokens/s, and the decode step against the HBM bound (`rlfarm.bench.engine_long_tail`) — and `profile=true`
writes a kernel table of the decode step to <run dir>/decode_profile.txt (`rlfarm.bench.engine_profile`);
`unfused_step=true` adds the decode step with a GEMM per projection beside the engine's fused q/k/v and gate/up.
`sizes.batches=[]` skips the throughput cases (the long-tail ones alone).
"""
from __future__ import annotations

import gc
import logging

import torch
from omegaconf import DictConfig, OmegaConf

from rlfarm.bench.common import median_rate, sizes, use_cpu_threads
from rlfarm.bench.engine_long_tail import run_long_tail
from rlfarm.config import CONF_DIR
from rlfarm.engines.hf import HFEngine
from rlfarm.errors import ConfigError
from rlfarm.models.lm import build_causal_lm

PLAIN, STATIC, OURS, OURS_GRAPHS = ("hf generate", "hf static+compile", "rlfarm engine",
                                    "rlfarm engine graphs only")
log = logging.getLogger("rlfarm")


def run(cfg: DictConfig, device: str) -> list[dict]:
    size = sizes(cfg, device)
    use_cpu_threads(cfg, device)
    dtype = getattr(torch, str(cfg.dtype)) if device == "cuda" else torch.float32
    torch.manual_seed(int(cfg.seed))
    shape = model_shape(cfg.get("shape"), size.model)
    with torch.device(device):  # initialize on the device: a CPU init of 0.5B parameters takes seconds
        model = build_causal_lm(shape).to(dtype).eval()
    model.generation_config.eos_token_id = None  # every row runs the full length, in every method
    model.generation_config.pad_token_id = 0
    vocab = int(shape["vocab_size"])
    new_tokens, prompt_len, repeats = int(size.new_tokens), int(size.prompt_len), int(size.repeats)
    # the default engine (on CUDA: static cache, compiled step, CUDA graphs), and graphs without compile
    engines = {OURS: HFEngine(model, pad_id=0, device=device, seed=int(cfg.seed))}
    if device == "cuda" and size.graphs_only_variant:
        engines[OURS_GRAPHS] = HFEngine(model, pad_id=0, device=device, seed=int(cfg.seed), compile=False)
    batches = [int(batch) for batch in size.batches]
    prompts = {batch: torch.randint(1, vocab, (batch, prompt_len), generator=torch.Generator().manual_seed(batch))
               for batch in batches}
    rows: list[dict] = []

    def add(row: dict) -> None:
        rows.append(row)
        log.info("%s: %.0f %s", row["case"], row["value"], row["unit"])  # visible even if a later case hangs

    common = lambda batch: {"unit": "tok/s", "batch": batch, "prompt_len": prompt_len,  # noqa: E731
                            "new_tokens": new_tokens}
    for batch in batches:
        tokens = batch * new_tokens
        for name, engine in engines.items():
            prompt_ids = prompts[batch].tolist()
            generate = lambda steps: engine.generate(prompt_ids, n=1, max_new_tokens=steps, temperature=1.0)  # noqa: E731
            rate = median_rate(lambda: generate(new_tokens), tokens, device, repeats=repeats, warmup=1)
            prefill_s = 1.0 / median_rate(lambda: generate(1), 1, device, repeats=repeats, warmup=1)
            add({"case": f"{name} b{batch}", "value": rate, "baseline": f"{PLAIN} b{batch}", **common(batch),
                 "prefill_s": round(prefill_s, 4),
                 "decode_ms_per_step": round(1e3 * (tokens / rate - prefill_s) / max(new_tokens - 1, 1), 3)})
        add({"case": f"{PLAIN} b{batch}", "baseline": None, **common(batch),
             "value": hf_generate_rate(model, prompts[batch], new_tokens, device, int(size.baseline_repeats), False)})
    static_batches = [int(batch) for batch in size.static_baseline_batches]
    if static_batches:  # last: HF compiles per shape, the slowest part of the run
        for batch in list(static_batches):
            try:
                add({"case": f"{STATIC} b{batch}", "baseline": f"{PLAIN} b{batch}", **common(batch),
                     "value": hf_generate_rate(model, prompts[batch], new_tokens, device,
                                               int(size.baseline_repeats), True)})
            except Exception as error:  # HF's compiled path is theirs: report its failure, keep the other rows
                log.error("%s b%d failed: %s", STATIC, batch, str(error).splitlines()[0] if str(error) else error)
                static_batches.remove(batch)
        for row in rows:
            if row["case"].startswith(OURS) and row["batch"] in static_batches:
                row["vs_static_compile"] = round(row["value"] / rows_value(rows, f"{STATIC} b{row['batch']}"), 2)
    long_tail = size.get("long_tail")
    if long_tail is not None:
        profile_steps = int(cfg.profile_steps) if cfg.get("profile") else 0
        for row in run_long_tail(model, long_tail, device, int(cfg.seed), vocab, profile_steps,
                                 bool(cfg.get("unfused_step", False))):
            add(row)
    gc.collect()
    return rows


def model_shape(name: str | None, sizes_model) -> dict:
    """The model config: conf/model/<name>.yaml's `config` when a shape is named, else the sizes' model."""
    if not name:
        return OmegaConf.to_container(sizes_model, resolve=True)
    path = CONF_DIR / "model" / f"{name}.yaml"
    config = OmegaConf.load(path).get("config") if path.is_file() else None
    if config is None or "vocab_size" not in config:
        shapes = sorted(p.stem for p in (CONF_DIR / "model").glob("*_shape.yaml"))
        raise ConfigError(f"bench.shape={name}: no model shape of that name with a vocabulary",
                          f"use one of: {', '.join(shapes)}")
    return OmegaConf.to_container(config, resolve=True)


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

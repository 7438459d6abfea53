"""GPU memory of an LLM run's learner ranks and engines from its config and planned topology (`rlfarm.memory_plan`'s
formulas; roles in one GPU bundle share that GPU): the lines `rlfarm plan` prints, and the check the llm family's
plan rules make before any role starts (`check_fits`: a GPU whose estimate exceeds the card the driver sees is
refused in one line; `run.memory_check=false` skips it). No torch unless the driver has an NVIDIA card."""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlfarm.errors import ConfigError
from rlfarm.memory_plan import GIB, LMShape, describe, engine_bytes, gpu_peaks, learner_bytes, lm_shape
from rlfarm.topology import Plan

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
ASSUMED_PROMPT = 512  # tokens, for a prompt file (its prompts are not read before the run)


def model_shape(cfg: DictConfig) -> LMShape | None:
    """The policy's shape as the roles build it (a built model's vocabulary is the digit tokenizer's); None for a
    model named by hub id and not on disk (nothing is fetched here)."""
    source = OmegaConf.select(cfg, "model.source")
    if source:
        config = Path(source) / "config.json"
        if not config.is_file():
            return None
        import json

        return lm_shape(json.loads(config.read_text()))
    from rlfarm.envs.text_tasks import DigitTokenizer

    return lm_shape(OmegaConf.to_container(cfg.model.config, resolve=True),
                    vocab=shape_vocab(cfg) or DigitTokenizer().vocab_size)


def shape_vocab(cfg: DictConfig) -> int | None:
    """model.vocab=shape (speed runs): a built model keeps its shape's vocabulary (e.g. Qwen2.5's 152,064 rows: the
    head's real cost) rather than the task tokenizer's; the tokens past the tokenizer's decode as '?'."""
    if cfg.model.get("source") or cfg.model.get("vocab", "task") == "task":
        return None
    if cfg.model.vocab != "shape":
        raise ConfigError(f"model.vocab must be task or shape, got {cfg.model.vocab!r}",
                          "use model.vocab=task (the task tokenizer's) or model.vocab=shape (the shape's own)")
    return int(cfg.model.config.vocab_size)


def sequence_tokens(cfg: DictConfig) -> tuple[int, int, str]:
    """(prompt tokens, new tokens, a note on what was assumed) of the run's longest sample."""
    env, algo = cfg.env, cfg.algo
    if env.get("task") == "prompts":
        new = int(algo.get("max_new_tokens") or env.get("max_new_tokens") or 256)
        return ASSUMED_PROMPT, new, f"prompts assumed ≤ {ASSUMED_PROMPT} tokens"
    digits = int(env.get("num_digits", 4))
    answer = digits + 1 if env.get("task") == "add" else digits
    prompt = (2 * digits + 1 if env.get("task") == "add" else digits) + 2  # BOS, the digits, '='
    return prompt, int(algo.get("max_new_tokens") or answer + 1), ""


def role_terms(cfg: DictConfig, learners: int, engines: int) -> dict[str, dict] | None:
    """{"learner": terms of one rank, "engine": terms of one engine} (bytes), or None where the shape is unknown."""
    shape = model_shape(cfg)
    if shape is None:
        return None
    algo = cfg.algo
    prompt, new, _ = sequence_tokens(cfg)
    samples = int(algo.prompts_per_step) * int(algo.group_size)
    rows = int(algo.get("micro_batch_size") or max(1, samples // int(algo.get("minibatches", 1)) // max(learners, 1)))
    tokens = rows * (prompt + new)
    if algo.get("micro_batch_tokens"):  # a piece holds at most that many (a row longer than that is a piece alone)
        tokens = max(int(algo.micro_batch_tokens), prompt + new)
    lora = OmegaConf.select(cfg, "model.lora")
    return {"learner": learner_bytes(shape, ranks=max(learners, 1), fsdp=algo.get("data_parallel") == "fsdp",
                                     tokens=tokens, lora_params=lora_params(shape, lora),
                                     recompute=bool(algo.get("activation_checkpointing", False)),
                                     packed=bool(algo.get("packed", False)),
                                     compiled=bool(algo.get("compile_layers", False))),
            "engine": engine_bytes(shape, slots=-(-samples // max(engines, 1)), cache_tokens=prompt + new,
                                   dtype_bytes=DTYPE_BYTES.get(str(cfg.model.get("dtype", "float32")), 4))}


def lora_params(shape: LMShape, lora) -> int:
    """Adapter parameters: r × (in + out) per targeted projection and layer."""
    if not lora:
        return 0
    q, kv, h, i = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.hidden, shape.intermediate
    sizes = {"q_proj": h + q, "k_proj": h + kv, "v_proj": h + kv, "o_proj": q + h, "gate_proj": h + i,
             "up_proj": h + i, "down_proj": i + h}
    return int(lora["r"]) * shape.layers * sum(sizes.get(name, 0) for name in lora["target_modules"])


def gpu_estimates(cfg: DictConfig, plan: Plan) -> tuple[dict[str, dict], dict[tuple, float]] | None:
    """(each role kind's terms, the peak bytes of each GPU bundle (pool, bundle)), or None (shape unknown)."""
    learners, engines = len(plan.of("learner")), len(plan.of("engine"))
    terms = role_terms(cfg, learners, engines)
    if terms is None:
        return None
    on_gpus = [(p.role, (p.pool, p.bundle), terms[p.role]) for p in plan.placements
               if p.role in terms and p.gpus > 0]
    return terms, gpu_peaks(on_gpus)


def plan_lines(cfg: DictConfig, plan: Plan) -> list[str]:
    """The plan's memory lines: each role's estimate with its terms, then each GPU's peak (against the card the
    driver sees, if it sees one)."""
    estimates = gpu_estimates(cfg, plan)
    if estimates is None:
        return ["memory: the model is named by hub id and not on disk: no estimate"]
    terms, peaks = estimates
    _, _, note = sequence_tokens(cfg)
    lines = [f"memory (estimate, rlfarm/memory_plan.py{'; ' + note if note else ''}):"]
    for kind in ("learner", "engine"):
        if plan.of(kind):
            lines.append(f"  {kind} (each of {len(plan.of(kind))}): {describe(terms[kind])}")
    card = visible_card_bytes()
    for (pool, bundle), peak in peaks.items():
        verdict = "" if not card else f" of {card / GIB:.0f} GiB: {'fits' if peak <= card else 'DOES NOT FIT'}"
        lines.append(f"  GPU {bundle} of pool {pool}: peak {peak / GIB:.1f} GiB{verdict}")
    return lines


def check_fits(cfg: DictConfig, plan: Plan) -> None:
    """Refuse a layout with a GPU whose estimated peak exceeds the card the driver sees (none seen: no check).
    A wrong model.vocab is refused here too, at preflight, before a run directory exists."""
    shape_vocab(cfg)
    card = visible_card_bytes() if cfg.run.get("memory_check", True) else None
    estimates = gpu_estimates(cfg, plan) if card else None
    if not estimates:
        return
    terms, peaks = estimates
    (pool, bundle), peak = max(peaks.items(), key=lambda item: item[1])
    if peak > card:
        held = "; ".join(f"{kind} {describe(t)}" for kind, t in terms.items() if plan.of(kind))
        raise ConfigError(
            f"GPU {bundle} of pool '{pool}' would need ~{peak / GIB:.0f} GiB, more than this machine's "
            f"{card / GIB:.0f} GiB card ({held})",
            "use algo.data_parallel=fsdp over more learner GPUs, a smaller algo.micro_batch_size, model.lora, "
            "or a split topology (run.memory_check=false skips this estimate)")


def visible_card_bytes() -> float | None:
    """Total memory of the driver's first CUDA device; None without an NVIDIA driver (then torch is not imported)."""
    if not Path("/proc/driver/nvidia/gpus").is_dir():
        return None
    import torch

    return float(torch.cuda.get_device_properties(0).total_memory) if torch.cuda.is_available() else None

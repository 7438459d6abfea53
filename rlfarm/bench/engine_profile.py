"""`rlfarm bench engine bench.profile=true`: where a decode step's time goes (issue 35, item 3).

The step profiled is the one the engine runs — on CUDA the replay of its captured graph (torch.compile's fused
kernels and cuBLAS' GEMMs inside), on CPU the eager step — replayed `steps` times under torch.profiler on the
cache of the decode-step row (all slots, the cap's cache length) at the context bucket of the mean context
P + cap/2 (the engine's `context_step`; None: the whole row), nothing else in the window: no prefill, no
host-side scheduling. Written to <run dir>/decode_profile.txt: the kernels by time per step, their share of the
step and launches per step, then torch.profiler's own table.
"""
from __future__ import annotations

from pathlib import Path

from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from rlfarm.bench.common import synchronize
from rlfarm.engines import static_decoder
from rlfarm.engines.buckets import contexts
from rlfarm.engines.hf import HFEngine

TOP = 60


def run_dir() -> Path:
    """The bench's run directory under Hydra (bench.json goes there), else the working directory."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except ValueError:  # not under Hydra
        return Path.cwd()


def profile_decode_step(engine: HFEngine, slots: int, prompt_len: int, cap: int, device: str, steps: int) -> dict:
    """Profile `steps` decode steps at `slots` rows; returns {"profile": path, "top_kernel": name, "top_share"}."""
    sampling = static_decoder.Sampling(1.0, 1.0, ())
    state, _, steppers = engine._static.prepare(slots, prompt_len, cap, sampling, max_batch=slots, refill=False)
    windows = contexts(state.cache_len, prompt_len, engine._static.context_step)
    context = next(window for window in windows if window >= prompt_len + cap / 2)
    step = steppers[slots, context]
    for _ in range(3):
        step()
    synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        synchronize(device)
    averages = prof.key_averages()
    timing = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    # on CUDA the kernels themselves (an operator's self device time would count its kernels a second time)
    kernels = [event for event in averages if device != "cuda" or event.device_type == DeviceType.CUDA]
    timed = sorted((event for event in kernels if getattr(event, timing, 0) > 0),
                   key=lambda event: getattr(event, timing), reverse=True)
    total_us = sum(getattr(event, timing) for event in timed)
    lines = [f"decode step profile: {slots} rows, cache of {prompt_len} + {cap} tokens, attending to {context} "
             f"columns, {steps} steps, {device}",
             f"time per step (sum of {'kernel' if device == 'cuda' else 'operator self'} times): "
             f"{total_us / steps / 1e3:.3f} ms", "",
             f"{'ms/step':>9} {'share':>6} {'calls/step':>10}  name"]
    for event in timed[:TOP]:
        spent = getattr(event, timing)
        lines.append(f"{spent / steps / 1e3:9.3f} {spent / total_us:6.1%} {event.count / steps:10.1f}  {event.key}")
    lines += ["", averages.table(sort_by=timing, row_limit=TOP)]
    path = run_dir() / "decode_profile.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    top = timed[0] if timed else None
    return {"profile": str(path), "top_kernel": top.key[:60] if top else None,
            "top_share": round(getattr(top, timing) / total_us, 3) if top else None}

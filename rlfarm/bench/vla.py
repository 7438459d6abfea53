"""`rlfarm bench vla` (issue 7): the VLA rollout against the sequential loop, on the same workload.

The workload: `envs` SAPIEN push-cube envs (physics only) in GRPO groups, the tiny VLA at the bench's width,
`repeats` rollouts of every env after one warm-up rollout. Each case runs `VLARolloutWorker.collect` — the
code the training loop runs — in worker processes that start together; this process only watches:
- `sequential`: one worker, `pipeline=False` (infer every env, then step every env, and again);
- `pipelined`: one worker, two env groups double-buffered (one steps on the env thread while the other is in
  inference) — what pipelining alone gives inside one process (SAPIEN's step and the picture hold the GIL);
- `pipelined × W workers`: the same envs split over W worker processes, each double-buffered, all running
  inference on the one GPU — the rollout farm, env stepping spread over W cores.
Rows: env steps/s, and how busy the inference device was: NVML's GPU busy on CUDA; on CPU the share of the
wall time some worker spent in inference (summed over workers, so W workers can exceed 100 %).
"""
from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing as mp
import os
import time

from omegaconf import DictConfig, OmegaConf

from rlfarm.bench.common import sizes

STEPS_UNIT = "env steps/s (higher is better)"
BUSY_UNIT = "% busy (higher is better)"


def run(cfg: DictConfig, device: str) -> list[dict]:
    from rlfarm.algos.vla import VLAConfig

    size = sizes(cfg, device)
    vla = VLAConfig(env=OmegaConf.to_container(size.env, resolve=True), chunk_size=int(size.chunk_size),
                    model=OmegaConf.to_container(size.model, resolve=True), group_size=int(size.group_size),
                    seed=0)
    groups = int(size.envs) // vla.group_size
    workers = int(size.workers)
    cases = [("sequential", 1, False), ("pipelined", 1, True), (f"pipelined × {workers} workers", workers, True)]
    busy_kind = "GPU busy (NVML)" if device == "cuda" else "inference share of wall time"
    rows = []
    for case, count, pipeline in cases:
        result = measure(dataclasses.replace(vla, pipeline=pipeline), groups, count, device,
                         int(size.repeats), float(size.timeout_s))
        baseline = None if case == "sequential" else "sequential"
        common = {"workers": count, "envs": groups * vla.group_size, "pipeline": pipeline, **result["breakdown"]}
        rows.append({"case": case, "value": result["env_steps_per_s"], "unit": STEPS_UNIT, "baseline": baseline,
                     **common})
        rows.append({"case": f"{case}: {busy_kind}", "value": result["busy_percent"], "unit": BUSY_UNIT,
                     "baseline": None if baseline is None else f"sequential: {busy_kind}", **common})
    return rows


def measure(vla, groups: int, workers: int, device: str, repeats: int, timeout_s: float) -> dict:
    """Start `workers` processes sharing `groups` GRPO groups; time `repeats` rollouts of each from a common go."""
    context = mp.get_context("spawn")  # CUDA in the children; a fork would inherit this process's state
    ready, results, go = context.Queue(), context.Queue(), context.Event()
    from rlfarm.loops.vla import split_groups

    shares = split_groups(groups, workers)
    procs = [context.Process(target=worker_main, args=(vla, share, i, device, repeats, ready, results, go),
                             daemon=True) for i, share in enumerate(shares)]
    for proc in procs:
        proc.start()
    try:
        for _ in procs:
            ready.get(timeout=timeout_s)  # each has built its envs and done one warm-up rollout
        sampler = busy_sampler(device)
        with sampler or contextlib.nullcontext():
            started = time.perf_counter()
            go.set()
            stats = [results.get(timeout=timeout_s) for _ in procs]
            wall = time.perf_counter() - started
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    rollouts = [s for worker_stats in stats for s in worker_stats]
    env_s, infer_s = sum(s["env_s"] for s in rollouts), sum(s["infer_s"] for s in rollouts)
    busy = (sum(sampler.mean_percent().values()) if device == "cuda" else 100.0 * infer_s / wall)
    return {"env_steps_per_s": sum(s["env_steps"] for s in rollouts) / wall, "busy_percent": busy,
            "breakdown": {"wall_s": round(wall, 3), "env_s": round(env_s, 3), "infer_s": round(infer_s, 3),
                          "overlap_s": round(sum(s["overlap_s"] for s in rollouts), 3),
                          "env_steps": sum(s["env_steps"] for s in rollouts),
                          "inference_calls": sum(s["inference_calls"] for s in rollouts)}}


def busy_sampler(device: str):
    """NVML sampling of the GPU the workers use (the first visible one); None on CPU."""
    if device != "cuda":
        return None
    from rlfarm.telemetry.gpu_busy import GpuBusySampler

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return GpuBusySampler(gpus=[int(visible.split(",")[0]) if visible else 0], interval_s=0.05)


def worker_main(vla, groups: int, index: int, device: str, repeats: int, ready, results, go) -> None:
    """One rollout worker process: warm up, report ready, wait for the common go, then `repeats` rollouts."""
    from rlfarm.roles.vla import VLARolloutWorker

    worker = VLARolloutWorker(vla, groups, index, threads=1, device="cuda:0" if device == "cuda" else "cpu")
    first = 1_000_003 * (index + 1)
    worker.collect(None, list(range(first, first + groups)))  # CUDA init, allocator, first-call costs
    ready.put(index)
    go.wait()
    stats = [worker.collect(None, list(range(first + (r + 1) * groups, first + (r + 2) * groups)))[1]
             for r in range(repeats)]
    worker.close()
    results.put(stats)

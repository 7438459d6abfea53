"""`rlfarm bench vla` (issues 7 and 17): VLA rollout layouts against the sequential loop, on the same workload.

The workload: `envs` SAPIEN push-cube envs (physics only) in GRPO groups, one policy, `repeats` rollouts of every
env after one warm-up rollout. The policy is the tiny built-in VLA at the bench's width, or, when `model_shape`
names one of `rlfarm.models.lm_factory.VLA_SHAPES`, a random-weight Llava of that shape (a VLA-sized one: CLIP
ViT at 224 px + a Qwen2.5-0.5B-shaped text model) built once into `checkpoint_dir` and loaded as `model=hf_vla`
does. Every case runs `VLARolloutWorker.collect` — the code the training loop runs; the cases (`cases`):
- `sequential`: one worker process, `pipeline=False` (infer every env, then step every env, and again), its policy
  on the GPU in the server's dtype (bfloat16 for an HF VLA): the baseline of every ratio;
- `pipelined`: one worker, two env groups double-buffered (one steps on the env thread while the other is in
  inference) — what pipelining alone gives inside one process (SAPIEN's step and the picture hold the GIL);
- `farm`: the envs split over W worker processes, each double-buffered and holding its own policy copy, all on
  the one GPU (`topology=vla_1gpu`);
- `server`: W rollout workers as Ray actors, each double-buffered, that hold no policy and send every policy call
  to one `VLAInferenceServer` on the GPU, which batches the calls of all workers (`topology=vla_1gpu_server`).
Rows: env steps/s, and how busy the inference device was: NVML's GPU busy on CUDA; on CPU the share of the wall
time some worker spent in inference (summed over workers, so W workers can exceed 100 %); each with its ratio to
the sequential loop. The server case adds its mean batch (observations per forward) and the share of the wall
time its policy thread was busy.
"""
from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlfarm.bench.common import sizes

STEPS_UNIT = "env steps/s (higher is better)"
BUSY_UNIT = "% busy (higher is better)"
BATCH_UNIT = "observations per forward"
SHARE_UNIT = "% of wall time"


def run(cfg: DictConfig, device: str) -> list[dict]:
    from rlfarm.algos.vla import VLAConfig

    size = sizes(cfg, device)
    model = policy_model(size, device)
    vla = VLAConfig(env=OmegaConf.to_container(size.env, resolve=True), chunk_size=int(size.chunk_size),
                    model=model, group_size=int(size.group_size), seed=0)
    groups = int(size.envs) // vla.group_size
    workers, server = int(size.workers), size.server
    dtype = str(size.get("dtype", "auto"))
    names = {"sequential": "sequential", "pipelined": "pipelined", "farm": f"pipelined × {workers} workers",
             "server": f"server × {workers} workers"}
    busy_kind = "GPU busy (NVML)" if device == "cuda" else "inference share of wall time"
    shape = size.get("model_shape") or f"tiny VLA, width {size.model.width}"
    rows = []
    for kind in size.cases:
        case = names[kind]
        if kind == "server":
            count, pipeline = workers, True
            result = measure_server(vla, groups, workers, device, int(size.repeats), float(size.timeout_s),
                                    int(server.max_batch), float(server.max_wait_ms), dtype, bool(server.graphs))
        else:
            count, pipeline = (1, kind == "pipelined") if kind != "farm" else (workers, True)
            result = measure(dataclasses.replace(vla, pipeline=pipeline), groups, count, device, int(size.repeats),
                             float(size.timeout_s), dtype)
        baseline = None if kind == "sequential" else "sequential"
        common = {"workers": count, "envs": groups * vla.group_size, "pipeline": pipeline, "policy": shape,
                  **result["breakdown"]}
        rows.append({"case": case, "value": result["env_steps_per_s"], "unit": STEPS_UNIT, "baseline": baseline,
                     **common})
        rows.append({"case": f"{case}: {busy_kind}", "value": result["busy_percent"], "unit": BUSY_UNIT,
                     "baseline": None if baseline is None else f"sequential: {busy_kind}", **common})
        if kind == "server":
            rows.append({"case": f"{case}: mean batch", "value": result["server"]["mean_batch"], "unit": BATCH_UNIT,
                         "baseline": None, **common, **result["server"]})
            rows.append({"case": f"{case}: server busy share", "value": result["server"]["busy_percent"],
                         "unit": SHARE_UNIT, "baseline": None, **common, **result["server"]})
    return rows


def policy_model(size: DictConfig, device: str) -> dict:
    """`VLAConfig.model`: the tiny VLA's keywords, or an HF checkpoint of `model_shape` (built if not saved yet)."""
    shape = size.get("model_shape")
    if not shape:
        return OmegaConf.to_container(size.model, resolve=True)
    folder = Path(os.path.expanduser(str(size.get("checkpoint_dir") or f"/tmp/rlfarm-vla-{shape}")))
    if not (folder / "config.json").exists():
        # a separate process: the weights' initialisation on the GPU leaves no CUDA context in this watcher
        subprocess.run([sys.executable, "-m", "rlfarm.models.lm_factory", "--vla", "--shape", str(shape),
                        "--out", str(folder), "--device", "cuda" if device == "cuda" else "cpu"], check=True)
    return {"source": str(folder), "max_words": int(size.get("max_words", 16))}


def measure(vla, groups: int, workers: int, device: str, repeats: int, timeout_s: float, dtype: str = "auto") -> dict:
    """Start `workers` processes sharing `groups` GRPO groups; time `repeats` rollouts of each from a common go."""
    context = mp.get_context("spawn")  # CUDA in the children; a fork would inherit this process's state
    ready, results, go = context.Queue(), context.Queue(), context.Event()
    from rlfarm.roles.vla_settings import split_groups

    shares = split_groups(groups, workers)
    procs = [context.Process(target=worker_main, args=(vla, share, i, device, repeats, ready, results, go, dtype),
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
    return summary([s for worker_stats in stats for s in worker_stats], wall, device, sampler)


def summary(rollouts: list[dict], wall: float, device: str, sampler) -> dict:
    env_s, infer_s = sum(s["env_s"] for s in rollouts), sum(s["infer_s"] for s in rollouts)
    busy = (sum(sampler.mean_percent().values()) if device == "cuda" else 100.0 * infer_s / wall)
    return {"env_steps_per_s": sum(s["env_steps"] for s in rollouts) / wall, "busy_percent": busy,
            "breakdown": {"wall_s": round(wall, 3), "env_s": round(env_s, 3), "infer_s": round(infer_s, 3),
                          "overlap_s": round(sum(s["overlap_s"] for s in rollouts), 3),
                          "env_steps": sum(s["env_steps"] for s in rollouts),
                          "inference_calls": sum(s["inference_calls"] for s in rollouts)}}


def measure_server(vla, groups: int, workers: int, device: str, repeats: int, timeout_s: float, max_batch: int,
                   max_wait_ms: float, dtype: str = "auto", graphs: bool = False) -> dict:
    """`workers` Ray actors (double-buffered) sharing `groups` GRPO groups and one inference server; the timed
    `repeats` rollouts of every worker are all submitted at once (each worker plays its own back to back)."""
    import ray

    from rlfarm.roles.vla_settings import split_groups
    from rlfarm.roles.vla import remote_worker_class
    from rlfarm.roles.vla_server import remote_server_class

    cuda = device == "cuda"
    ours = not ray.is_initialized()
    if ours:
        ray.init(address="local", num_cpus=max(os.cpu_count() or 1, workers + 2), num_gpus=1 if cuda else 0, include_dashboard=False,
                 _node_ip_address="127.0.0.1", configure_logging=False)
    actors = []
    try:
        shares = split_groups(groups, workers)
        vla = dataclasses.replace(vla, pipeline=True)
        actors = [remote_worker_class().options(num_cpus=1, num_gpus=0).remote(vla, share, i, 1, "cpu")
                  for i, share in enumerate(shares)]
        shapes = ray.get(actors[0].shapes.remote(), timeout=timeout_s)
        server = remote_server_class().options(
            num_cpus=1, num_gpus=1 if cuda else 0, max_concurrency=2 * workers + 8).remote(
                vla, shapes, max_batch, max_wait_ms, 1, "cuda:0" if cuda else "cpu", dtype, graphs)
        actors.append(server)
        ray.get([worker.set_server.remote(server) for worker in actors[:-1]], timeout=timeout_s)
        firsts = [1_000_003 * (i + 1) for i in range(workers)]

        def rollouts(r: int) -> list:  # every worker's r-th rollout; only its stats come back here
            return [worker.collect.options(num_returns=2).remote(list(range(f + r * n, f + (r + 1) * n)))[1]
                    for worker, f, n in zip(actors, firsts, shares)]

        ray.get(rollouts(0), timeout=timeout_s)  # warm-up: imports, CUDA init, first calls of every batch size
        before = ray.get(server.stats.remote())
        sampler = busy_sampler(device)
        with sampler or contextlib.nullcontext():
            started = time.perf_counter()
            stats = ray.get([ref for r in range(1, repeats + 1) for ref in rollouts(r)], timeout=timeout_s)
            wall = time.perf_counter() - started
        after = ray.get(server.stats.remote())
    finally:
        for actor in actors:
            ray.kill(actor)
        if ours:
            ray.shutdown()
    result = summary(stats, wall, device, sampler)
    batches = max(after["batches"] - before["batches"], 1)
    result["server"] = {"mean_batch": (after["observations"] - before["observations"]) / batches,
                        "busy_percent": 100.0 * (after["busy_s"] - before["busy_s"]) / wall,
                        "batches": after["batches"] - before["batches"], "largest_batch": after["largest_batch"],
                        "max_batch": max_batch, "max_wait_ms": max_wait_ms, "dtype": after["dtype"],
                        "graphs": after["graphs"]}
    return result


def busy_sampler(device: str):
    """NVML sampling of the GPU the workers use (the first visible one); None on CPU."""
    if device != "cuda":
        return None
    from rlfarm.telemetry.gpu_busy import GpuBusySampler

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return GpuBusySampler(gpus=[int(visible.split(",")[0]) if visible else 0], interval_s=0.05)


def worker_main(vla, groups: int, index: int, device: str, repeats: int, ready, results, go,
                dtype: str = "auto") -> None:
    """One rollout worker process: warm up, report ready, wait for the common go, then `repeats` rollouts."""
    from rlfarm.roles.vla import VLARolloutWorker
    from rlfarm.roles.vla_server import inference_policy

    where = "cuda:0" if device == "cuda" else "cpu"
    worker = VLARolloutWorker(vla, groups, index, threads=1, device=where)
    worker.policy = inference_policy(vla, worker.shapes(), where, dtype)  # the server's dtype: a like-for-like baseline
    first = 1_000_003 * (index + 1)
    worker.collect(list(range(first, first + groups)))  # CUDA init, allocator, first-call costs
    ready.put(index)
    go.wait()
    stats = [worker.collect(list(range(first + (r + 1) * groups, first + (r + 2) * groups)))[1]
             for r in range(repeats)]
    worker.close()
    results.put(stats)

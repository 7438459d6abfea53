"""The actor-learner's update (IMPALA / APPO, rlfarm/algos/vtrace_agent.py) on Atari-shaped batches: transitions
trained per second by one learner — float32 eager (the baseline), bf16 autocast, bf16 + torch.compile — and by N
data-parallel ranks (one process per GPU, gradients averaged in one all-reduce per step, as the learner role's ranks
do), each rank on a batch of its own, so N ranks train N batches per step.

A batch is what `trajectories` hands the agent: `batch_chunks` chunks of `chunk_steps` steps × `envs` sub-envs side
by side, uint8 frames, already on the device (the host side is the role's and is measured end to end by
launch/device/atari_appo.sh), V-trace's lookups at each chunk's last step. The data is random: the speed does not
depend on it. On CPU (the CI smoke test) the sizes are tiny, compile is skipped and the ranks use gloo.
"""
from __future__ import annotations

import logging
import socket
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from rlfarm.algos.vtrace_agent import BatchStaging, VTraceAgent, VTraceConfig, trajectories
from rlfarm.bench.common import median_rate, sizes, use_cpu_threads
from rlfarm.models.conv_actor_critic import ConvActorCritic

log = logging.getLogger("rlfarm")

UNIT = "transitions/s"


def run(cfg: DictConfig, device: str) -> list[dict]:
    size = sizes(cfg, device)
    use_cpu_threads(cfg, device)
    common = {"batch": int(size.batch_chunks) * int(size.chunk_steps) * int(size.envs), "side": int(size.side),
              "encoder": str(size.encoder), "loss": str(size.loss), "epochs": int(size.epochs)}
    rows = []
    for variant in size.variants:
        if device == "cpu" and (bool(variant.compile) or bool(variant.bf16)):
            continue  # CPU: autocast is CUDA-only (the row would be fp32 again), and inductor takes minutes on CI
        compiled = bool(variant.compile)
        rate, updates = measure_one(size, device, bf16=bool(variant.bf16), compile=compiled,
                                    from_host=bool(variant.get("from_host", False)))
        rows.append({"case": str(variant.case), "value": rate, "unit": UNIT, "updates_per_s": updates,
                     "baseline": None if not rows else rows[0]["case"], **common})
        log.info("%s: %.0f transitions/s (%.1f updates/s)", variant.case, rate, updates)
    ranks = int(size.ranks)
    available = torch.cuda.device_count() if device != "cpu" else ranks
    if ranks > 1 and available >= ranks:
        reference = next((row for row in rows if row["case"] == str(size.ranks_variant)), rows[0])
        rate, updates = measure_ranks(size, device, ranks)
        rows.append({"case": f"{ranks} ranks ({reference['case']})", "value": rate, "unit": UNIT,
                     "updates_per_s": updates, "baseline": reference["case"], **common})
        log.info("%d ranks: %.0f transitions/s", ranks, rate)
    elif ranks > 1:
        log.warning("%d data-parallel ranks need %d GPUs; this machine has %d: no ranks row", ranks, ranks, available)
    return rows


def build(size: DictConfig, device: str, bf16: bool, compile: bool, seed: int = 0) -> tuple[VTraceAgent, list[dict]]:
    """An agent (the Atari network) and one batch on the device, as `trajectories` makes it."""
    torch.manual_seed(seed)
    side, channels, actions = int(size.side), int(size.channels), int(size.actions)
    model = ConvActorCritic(channels * side * side, actions, channels=channels, encoder=str(size.encoder))
    cfg = VTraceConfig(loss=str(size.loss), epochs=int(size.epochs), bf16=bf16, compile=compile)
    agent = VTraceAgent(model, cfg, device)
    steps, envs = int(size.chunk_steps), int(size.batch_chunks) * int(size.envs)
    generator = torch.Generator().manual_seed(seed)
    obs_dim = channels * side * side
    group = {"obs": torch.randint(0, 256, (steps, envs, obs_dim), dtype=torch.uint8, generator=generator),
             "action": torch.randint(0, actions, (steps, envs), generator=generator),
             "logprob": torch.full((steps, envs), -torch.log(torch.tensor(float(actions))).item()),
             "reward": torch.randn(steps, envs, generator=generator),
             "terminated": torch.rand(steps, envs, generator=generator) < 0.001,
             "truncated": torch.zeros(steps, envs, dtype=torch.bool),
             "lookup_t": torch.full((envs,), steps - 1), "lookup_n": torch.arange(envs),
             "lookup_obs": torch.randint(0, 256, (envs, obs_dim), dtype=torch.uint8, generator=generator)}
    return agent, [{k: v.to(device) for k, v in group.items()}]


def measure_one(size: DictConfig, device: str, bf16: bool, compile: bool, from_host: bool = False
                ) -> tuple[float, float]:
    """(transitions/s, updates/s) of one learner; a compiled one is warmed up (compiled) before the timing.
    from_host: every update starts from the chunks in host memory, as the role's do (`trajectories`: gathered into
    pinned buffers, uploaded, V-trace's lookups picked), so the row shows what the host side adds to the GPU's work."""
    agent, groups = build(size, device, bf16, compile)
    updates = int(size.updates)
    batch = groups[0]["reward"].numel()
    chunks, staging = host_chunks(groups[0], size), BatchStaging(device)

    def work() -> None:
        for _ in range(updates):
            agent.update(trajectories(chunks, staging) if from_host else groups)

    started = time.perf_counter()
    work()  # warm-up (and compile), not timed
    log.info("warm-up %s: %.1f s", "bf16+compile" if compile else ("bf16" if bf16 else "fp32"),
             time.perf_counter() - started)
    rate = median_rate(work, updates, device, int(size.repeats), warmup=0)
    return rate * batch, rate


def host_chunks(group: dict[str, torch.Tensor], size: DictConfig) -> list[tuple[dict, dict]]:
    """The batch as `batch_chunks` labeled chunks in host memory (flat [T·N, ...] numpy arrays, as they arrive)."""
    steps, envs = int(size.chunk_steps), int(size.envs)
    fields = {k: group[k].cpu().numpy() for k in ("obs", "action", "logprob", "reward", "terminated", "truncated")}
    chunks = []
    for i in range(int(size.batch_chunks)):
        part = {k: np.ascontiguousarray(v[:, i * envs:(i + 1) * envs]).reshape(steps * envs, *v.shape[2:])
                for k, v in fields.items()}
        part["next_obs"] = part["obs"].copy()
        chunks.append(({"envs": envs, "size": steps * envs}, part))
    return chunks


def measure_ranks(size: DictConfig, device: str, ranks: int) -> tuple[float, float]:
    """N processes, one per GPU, each updating on its own batch with gradients averaged: (transitions/s of all ranks
    together, updates/s). The ranks report through files; rank 0's rate is the step rate (they move in lockstep)."""
    import torch.multiprocessing as mp

    variant = next(v for v in size.variants if str(v.case) == str(size.ranks_variant))
    if device == "cpu":
        variant = {"bf16": False, "compile": False}
    with tempfile.TemporaryDirectory() as folder:
        port = _free_port()
        mp.spawn(_rank_main, args=(ranks, port, folder, OmegaConf.to_container(size), device, bool(variant["bf16"]),
                                   bool(variant["compile"])), nprocs=ranks, join=True)
        updates = float(Path(folder, "rank0").read_text())
    batch = int(size.batch_chunks) * int(size.chunk_steps) * int(size.envs)
    return updates * batch * ranks, updates


def _rank_main(rank: int, ranks: int, port: int, folder: str, size: dict, device: str, bf16: bool,
               compile: bool) -> None:
    import torch.distributed as dist

    from rlfarm.data_parallel import average_gradients, broadcast_parameters

    on_gpu = device != "cpu"
    if on_gpu:
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(1)  # a core each
    dist.init_process_group("nccl" if on_gpu else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=ranks)
    try:
        size = OmegaConf.create(size)
        agent, groups = build(size, f"cuda:{rank}" if on_gpu else "cpu", bf16, compile, seed=rank)
        broadcast_parameters(agent.actor)
        agent.average_gradients = lambda parameters: average_gradients(parameters, ranks)
        updates = int(size.updates)

        def work() -> None:
            for _ in range(updates):
                agent.update(groups)
            dist.barrier()

        work()  # warm-up
        rate = median_rate(work, updates, f"cuda:{rank}" if on_gpu else "cpu", int(size.repeats), warmup=0)
        Path(folder, f"rank{rank}").write_text(str(rate))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

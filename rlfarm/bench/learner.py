"""P3: SAC learner updates/s, batch 256, 256×2 MLPs, sampling from a replay buffer on the learner's device.

Rows per case (observation/action sizes): `eager` is SACAgent.update(buffer.sample()) — one update at a time,
as the learner role runs it — and is the baseline; every fast row (rlfarm/algos/sac_graph.py: sampling,
critic, actor, temperature, Adam and Polyak of several updates captured in one CUDA graph, optionally
compiled) is measured next to it on the same agent and the same buffer. With `profile`, each row also gets
the number of GPU kernels and the GPU busy time per update (torch.profiler), which says what the time goes to.
"""
from __future__ import annotations

import functools
import logging
import time

import torch
from omegaconf import DictConfig

from rlfarm.algos.sac import SACAgent
from rlfarm.algos.sac_graph import GraphedSACUpdates, SACStep, replay_draw
from rlfarm.bench.common import median_rate, sizes, synchronize
from rlfarm.buffers.replay import ReplayBuffer
from rlfarm.buffers.sampler import UniformSampler
from rlfarm.buffers.storage import TensorStorage
from rlfarm.models.mlp import EnsembleQ, SquashedGaussianActor

log = logging.getLogger("rlfarm")

UNIT = "updates/s"


def run(cfg: DictConfig, device: str) -> list[dict]:
    size = sizes(cfg, device)
    if device == "cpu":
        # As the learner role does (threads: 1): on a shared 2-core machine more threads mostly wait on each other.
        torch.set_num_threads(int(cfg.cpu_threads))
    rows = []
    for case, dims in cfg.cases.items():
        rows += measure_case(str(case), int(dims.obs_dim), int(dims.act_dim), size, int(cfg.seed), device)
    return rows


def build_agent(obs_dim: int, act_dim: int, hidden: list[int], seed: int, device: str) -> SACAgent:
    torch.manual_seed(seed)
    return SACAgent(obs_dim, act_dim, [-1.0] * act_dim, [1.0] * act_dim,
                    actor=functools.partial(SquashedGaussianActor, hidden=hidden),
                    critic=functools.partial(EnsembleQ, hidden=hidden), device=device)


def filled_buffer(obs_dim: int, act_dim: int, rows: int, batch_size: int, seed: int, device: str) -> ReplayBuffer:
    """A replay buffer on `device` holding `rows` random transitions (what is sampled does not change the speed)."""
    generator = torch.Generator().manual_seed(seed)
    buffer = ReplayBuffer(TensorStorage(rows, device), UniformSampler(batch_size, generator_seed=seed))
    buffer.extend({"obs": torch.randn(rows, obs_dim, generator=generator),
                   "action": torch.rand(rows, act_dim, generator=generator) * 2 - 1,
                   "reward": torch.randn(rows, generator=generator),
                   "next_obs": torch.randn(rows, obs_dim, generator=generator),
                   "terminated": (torch.rand(rows, generator=generator) < 0.01).float()})
    return buffer


def measure_case(case: str, obs_dim: int, act_dim: int, size: DictConfig, seed: int, device: str) -> list[dict]:
    agent = build_agent(obs_dim, act_dim, list(size.hidden), seed, device)
    buffer = filled_buffer(obs_dim, act_dim, int(size.buffer_rows), int(size.batch_size), seed, device)
    common = {"batch": int(size.batch_size), "hidden": "×".join(map(str, size.hidden)),
              "obs_dim": obs_dim, "act_dim": act_dim}
    eager_case = f"{case}/eager"
    # An even count keeps the agent at a multiple of policy_frequency for the fast path that follows.
    eager_updates = max(agent.policy_frequency, int(size.eager_updates) // agent.policy_frequency * agent.policy_frequency)

    def eager() -> None:
        for _ in range(eager_updates):
            agent.update(buffer.sample())

    rows = [{"case": eager_case, "value": median_rate(eager, eager_updates, device, int(size.repeats)),
             "unit": UNIT, "baseline": None, **common,
             **(kernel_profile(agent_update_once(agent, buffer), 1, device) if size.profile else {})}]
    log.info("%s: %.0f updates/s", eager_case, rows[0]["value"])
    fill = torch.tensor(float(len(buffer)), dtype=torch.float64, device=device)
    steps: dict[bool, SACStep] = {}  # one (compiled) step per setting: compiling it again would take as long
    for variant in size.fast:
        name = f"{case}/{variant.case}"
        try:
            compile_step = bool(variant.compile) and device != "cpu"
            step = steps.setdefault(compile_step, SACStep(agent, compile=compile_step))
            per_call = int(variant.updates_per_call)
            updates = GraphedSACUpdates(step, replay_draw(buffer.storage.fields, fill, int(size.batch_size), per_call, agent),
                                        per_call)
            started = time.perf_counter()
            updates()  # capture (and compile): measured apart, as setup
            synchronize(device)
            setup_s = time.perf_counter() - started
            calls = max(1, int(size.fast_updates) // per_call)

            def fast() -> None:
                for _ in range(calls):
                    updates()

            row = {"case": name, "value": median_rate(fast, calls * per_call, device, int(size.repeats)),
                   "unit": UNIT, "baseline": eager_case, **common, "updates_per_call": per_call,
                   "graph": updates.graph, "compile": compile_step, "setup_s": round(setup_s, 2),
                   **(kernel_profile(updates, per_call, device) if size.profile else {})}
        except Exception as error:  # one failing variant (e.g. a compiler problem) must not hide the others
            log.warning("%s failed: %s: %s", name, type(error).__name__, error, exc_info=True)
            row = {"case": name, "value": 0.0, "unit": UNIT, "baseline": eager_case, **common,
                   "error": f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"}
        log.info("%s: %.0f updates/s", name, row["value"])
        rows.append(row)
    return rows


def agent_update_once(agent: SACAgent, buffer: ReplayBuffer):
    return lambda: agent.update(buffer.sample())


def kernel_profile(work, updates: int, device: str) -> dict:
    """GPU kernels launched and GPU busy time per update while `work()` does `updates` updates (two calls
    profiled, after one unprofiled). Empty on CPU or when the profiler sees no kernels."""
    if device == "cpu":
        return {}
    from torch.profiler import ProfilerActivity, profile

    work()
    synchronize(device)
    calls = 2
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        for _ in range(calls):
            work()
        synchronize(device)
    kernels = [e for e in profiler.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not kernels:
        return {}
    busy_us = sum(getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0) for e in kernels)
    return {"kernels_per_update": round(len(kernels) / (calls * updates), 1),
            "gpu_busy_us_per_update": round(busy_us / (calls * updates), 1)}

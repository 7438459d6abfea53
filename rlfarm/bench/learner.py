"""P3: SAC learner updates/s, batch 256, 256×2 MLPs, sampling from a replay buffer on the learner's device.

Rows per case (observation/action sizes): `eager` is SACAgent.update(buffer.sample()) — one update at a time,
as the learner role runs it on CPU — and is the baseline; every fast row (rlfarm/algos/sac_graph.py: sampling,
critic, actor, temperature, Adam and Polyak of several updates captured in one CUDA graph, optionally
compiled) is measured next to it on an identical agent (same seed) and the same buffer. With `profile`, each row also gets
the number of GPU kernels and the GPU busy time per update (torch.profiler), which says what the time goes to.

With `role`, a last row per case times the learner role itself (rlfarm/roles/sac_learner.py, built in this
process on the bench's device): conf/algo/sac.yaml and conf/model/mlp.yaml as `rlfarm train` composes them,
with the bench's batch size, hidden sizes and buffer rows, doing its bursts (`update_burst`: updates in CUDA-graph
groups on a GPU, weights published every `publish_every`). That is the figure to hold `updates/s` inside the
pipeline against, at the same sizes, e.g.
`rlfarm bench learner bench.sizes.batch_size=4096 'bench.sizes.hidden=[256,256]'`.

With `beside`, the role's loop is timed again with what surrounds it in the pipeline — chunks stored at a set rate
and stats polled, EGL renderers on its GPU, both — each row against the loop alone
(rlfarm/bench/learner_beside.py), e.g. `rlfarm bench learner device=cuda 'bench.cases={halfcheetah:
{obs_dim: 17, act_dim: 6}}' 'bench.sizes.fast=[]' bench.sizes.batch_size=1024`.
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import time

import torch
from omegaconf import DictConfig, OmegaConf

from rlfarm.algos.sac import SACAgent
from rlfarm.config import CONF_DIR
from rlfarm.algos.sac_graph import GraphedSACUpdates, SACStep, replay_draw
from rlfarm.bench.common import median_rate, sizes, synchronize, use_cpu_threads
from rlfarm.bench.learner_beside import measure_beside
from rlfarm.buffers.replay import ReplayBuffer
from rlfarm.buffers.sampler import UniformSampler
from rlfarm.buffers.storage import TensorStorage
from rlfarm.models.mlp import EnsembleQ, SquashedGaussianActor
from rlfarm.roles.sac_learner import SACLearner

log = logging.getLogger("rlfarm")

UNIT = "updates/s"


def run(cfg: DictConfig, device: str) -> list[dict]:
    size = sizes(cfg, device)
    use_cpu_threads(cfg, device)
    # Every compiled variant of every case is another entry in dynamo's per-function cache (Adam.step is one
    # function for all optimizers): the default limit of 8 would silently send later variants back to eager.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    rows, profiles = [], []
    for case, dims in cfg.cases.items():
        case_rows, case_profiles = measure_case(str(case), int(dims.obs_dim), int(dims.act_dim), size,
                                                int(cfg.seed), device)
        rows += case_rows
        profiles += case_profiles
    # Profiling last: a profiler session can leave tracing hooks behind that would slow the timed rows.
    for row, work, updates in profiles if size.profile else []:
        row.update(kernel_profile(work, updates, device))
    return rows


def build_agent(obs_dim: int, act_dim: int, hidden: list[int], seed: int, device: str) -> SACAgent:
    torch.manual_seed(seed)
    return SACAgent(obs_dim, act_dim, [-1.0] * act_dim, [1.0] * act_dim,
                    actor=functools.partial(SquashedGaussianActor, hidden=hidden),
                    critic=functools.partial(EnsembleQ, hidden=hidden), device=device)


def filled_buffer(obs_dim: int, act_dim: int, rows: int, batch_size: int, seed: int, device: str) -> ReplayBuffer:
    """A replay buffer on `device` holding `rows` random transitions (what is sampled does not change the speed)."""
    buffer = ReplayBuffer(TensorStorage(rows, device), UniformSampler(batch_size, generator_seed=seed))
    buffer.extend(random_transitions(obs_dim, act_dim, rows, seed))
    return buffer


def random_transitions(obs_dim: int, act_dim: int, rows: int, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {"obs": torch.randn(rows, obs_dim, generator=generator),
            "action": torch.rand(rows, act_dim, generator=generator) * 2 - 1,
            "reward": torch.randn(rows, generator=generator),
            "next_obs": torch.randn(rows, obs_dim, generator=generator),
            "terminated": (torch.rand(rows, generator=generator) < 0.01).float()}


def measure_case(case: str, obs_dim: int, act_dim: int, size: DictConfig, seed: int,
                 device: str) -> tuple[list[dict], list[tuple]]:
    """(rows, [(row, work, updates per work() call)] to profile)."""
    # Two identical agents: the fast path switches its agent's optimizers to capturable (and, compiled, to
    # foreach) Adam, and the eager row's profile at the end must see the eager update as it was timed.
    eager_agent = build_agent(obs_dim, act_dim, list(size.hidden), seed, device)
    agent = build_agent(obs_dim, act_dim, list(size.hidden), seed, device)
    buffer = filled_buffer(obs_dim, act_dim, int(size.buffer_rows), int(size.batch_size), seed, device)
    common = {"batch": int(size.batch_size), "hidden": "×".join(map(str, size.hidden)),
              "obs_dim": obs_dim, "act_dim": act_dim}
    eager_case = f"{case}/eager"
    # An even count keeps the agent at a multiple of policy_frequency for the fast path that follows.
    eager_updates = int(size.eager_updates)

    def eager() -> None:
        for _ in range(eager_updates):
            eager_agent.update(buffer.sample())

    def eager_pair() -> None:  # one update with the actor's steps, one without
        for _ in range(eager_agent.policy_frequency):
            eager_agent.update(buffer.sample())

    rows = [{"case": eager_case, "value": median_rate(eager, eager_updates, device, int(size.repeats)),
             "unit": UNIT, "baseline": None, **common}]
    profiles = [(rows[0], eager_pair, eager_agent.policy_frequency)]
    log.info("%s: %.0f updates/s", eager_case, rows[0]["value"])
    fill = torch.tensor(float(len(buffer)), dtype=torch.float64, device=device)
    steps: dict[tuple, SACStep] = {}  # one (compiled) step per setting: compiling it again would take as long
    for variant in size.fast:
        name = f"{case}/{variant.case}"
        compile_step = bool(variant.compile) and device != "cpu"
        options = OmegaConf.to_container(variant.options) if compile_step and variant.get("options") else {}
        compile_optimizers = compile_step and bool(variant.get("compile_optimizers", True))
        tf32 = bool(variant.get("tf32", False)) and device != "cpu"
        try:
            with tf32_matmuls(tf32):
                key = (compile_step, compile_optimizers, json.dumps(options, sort_keys=True), tf32)
                if key not in steps:
                    steps[key] = SACStep(agent, compile=compile_step, compile_optimizers=compile_optimizers,
                                         compile_options=options)
                step = steps[key]
                per_call = int(variant.updates_per_call)
                updates = GraphedSACUpdates(step, replay_draw(buffer, fill, per_call, agent), per_call)
                started = time.perf_counter()
                updates()  # capture (and compile): measured apart, as setup
                synchronize(device)
                setup_s = time.perf_counter() - started
                calls = max(1, int(size.fast_updates) // per_call)

                def fast() -> None:
                    for _ in range(calls):
                        updates()

                value = median_rate(fast, calls * per_call, device, int(size.repeats))
            row = {"case": name, "value": value, "unit": UNIT, "baseline": eager_case, **common,
                   "updates_per_call": per_call, "graph": updates.graph,
                   "compile": ("losses+optimizers" if compile_optimizers else "losses") if compile_step else "no",
                   **({"options": ",".join(options)} if options else {}), **({"tf32": True} if tf32 else {}),
                   "setup_s": round(setup_s, 2)}
            profiles.append((row, updates, per_call))
        except Exception as error:  # one failing variant (e.g. a compiler problem) must not hide the others
            log.warning("%s failed: %s: %s", name, type(error).__name__, error, exc_info=True)
            row = {"case": name, "value": 0.0, "unit": UNIT, "baseline": eager_case, **common,
                   "error": f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"}
        log.info("%s: %.0f updates/s", name, row["value"])
        rows.append(row)
    if size.get("role", False):
        role_rows = measure_role(case, obs_dim, act_dim, size, seed, device)
        role_rows[0] |= {"baseline": eager_case}
        log.info("%s: %.0f updates/s", role_rows[0]["case"], role_rows[0]["value"])
        rows += role_rows
    return rows, profiles


def measure_role(case: str, obs_dim: int, act_dim: int, size: DictConfig, seed: int, device: str) -> list[dict]:
    """The SAC learner role's bursts, as its update loop runs them, at the bench's sizes (see the docstring); then,
    for the case `size.beside` names, the role's loop with its pipeline neighbours (rlfarm/bench/learner_beside.py)."""
    algo = OmegaConf.load(CONF_DIR / "algo" / "sac.yaml")
    algo.batch_size, algo.buffer_size, algo.learning_starts = int(size.batch_size), int(size.buffer_rows), 0
    model = OmegaConf.load(CONF_DIR / "model" / "mlp.yaml")
    model.actor.hidden = model.critic.hidden = list(size.hidden)
    spaces = {"obs_dim": obs_dim, "act_dim": act_dim, "action_low": [-1.0] * act_dim, "action_high": [1.0] * act_dim}
    name = f"{case}/role"
    common = {"batch": int(size.batch_size), "hidden": "×".join(map(str, size.hidden)),
              "obs_dim": obs_dim, "act_dim": act_dim, "unit": UNIT}
    try:
        learner = SACLearner(OmegaConf.to_container(algo, resolve=True), OmegaConf.to_container(model, resolve=True),
                             spaces, seed, torch.get_num_threads(), device=device)
        learner.buffer.extend(random_transitions(obs_dim, act_dim, int(size.buffer_rows), seed))
        burst = learner.max_burst
        started = time.perf_counter()
        learner.update_burst(burst)  # capture (and compile) on a GPU: measured apart, as setup
        synchronize(device)
        setup_s = time.perf_counter() - started
        calls = max(1, int(size.fast_updates) // burst)

        def bursts() -> None:
            for _ in range(calls):
                learner.update_burst(burst)

        value = median_rate(bursts, calls * burst, device, int(size.repeats))
        agent_cfg = algo.agent
        rows = [{"case": name, "value": value, **common, "updates_per_call": burst,
                 "graph": learner.graphed is not None,
                 "graph_updates": int(agent_cfg.graph_updates) if learner.graphed else 0,
                 "compile": "losses+optimizers" if learner.graphed and learner.graphed.compile else "no",
                 "setup_s": round(setup_s, 2)}]
    except Exception as error:  # as a failing fast variant: the other rows still count
        log.warning("%s failed: %s: %s", name, type(error).__name__, error, exc_info=True)
        return [{"case": name, "value": 0.0, **common,
                 "error": f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"}]
    try:
        beside = size.get("beside")
        if beside and str(beside.case) == case:
            rows += [row | {k: v for k, v in common.items() if k not in row}
                     for row in measure_beside(learner, case, obs_dim, act_dim, beside, device)]
    except Exception as error:  # the role row above still counts
        log.warning("%s beside its neighbours failed: %s: %s", name, type(error).__name__, error, exc_info=True)
        rows.append({"case": f"{case}/role loop", "value": 0.0, **common, "baseline": None,
                     "error": f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"})
    finally:
        learner.publisher.close()
    return rows


@contextlib.contextmanager
def tf32_matmuls(enabled: bool):
    """TF32 tensor cores for float32 matmuls inside the block (captured graphs keep the kernels chosen then).
    Not the eager update's precision, so such rows do not meet the 1e-5 equality: they show what the GEMMs cost."""
    if not enabled:
        yield
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


# Kernel name fragments → what the time goes to (cuBLAS/CUTLASS matmuls, inductor's fused Triton kernels,
# the fused Adam and foreach kernels of the optimizers and Polyak averaging).
KERNEL_KINDS = (("gemm", ("gemm", "cutlass", "xmma", "gemv", "splitk", "sm90_", "sm80_")),
                ("triton", ("triton",)), ("optim", ("adam", "foreach", "multi_tensor", "lerp")))


def kernel_kind(name: str) -> str:
    lowered = name.lower()
    return next((kind for kind, marks in KERNEL_KINDS if any(mark in lowered for mark in marks)), "other")


def kernel_profile(work, updates: int, device: str) -> dict:
    """GPU kernels launched and GPU busy time per update while `work()` does `updates` updates (two calls
    profiled, after one unprofiled). Empty on CPU or when the profiler sees no kernels."""
    if device == "cpu":
        return {}
    from torch.profiler import ProfilerActivity, profile

    calls = 2
    try:
        work()
        synchronize(device)
        with profile(activities=[ProfilerActivity.CUDA]) as profiler:
            for _ in range(calls):
                work()
            synchronize(device)
    except Exception as error:  # the breakdown is extra: never lose the measured rows to it
        log.warning("profiling failed: %s: %s", type(error).__name__, error)
        return {}
    kernels = [e for e in profiler.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not kernels:
        return {}
    per_update = calls * updates
    by_kind: dict[str, float] = {kind: 0.0 for kind, _ in KERNEL_KINDS} | {"other": 0.0}
    for event in kernels:
        by_kind[kernel_kind(event.name)] += getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0.0)
    return {"kernels_per_update": round(len(kernels) / per_update, 1),
            "gpu_busy_us_per_update": round(sum(by_kind.values()) / per_update, 1),
            **{f"{kind}_us": round(time_us / per_update, 1) for kind, time_us in by_kind.items()}}

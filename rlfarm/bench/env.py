"""`rlfarm bench env`: one env runner's env steps/s on its collect path next to the raw env, in the same process.

- raw (the baseline): num_envs gymnasium envs, each stepped and rendered at frame_size in a loop, reset when
  an episode ends: the floor of what acting costs, nothing else.
- runner workers=W: `EnvRunner.collect` as the role runs it, without Ray: one batched policy forward per vector
  step, the step and render of every sub-env (in this process for W=0, in W worker processes otherwise), the
  chunk filled in place. Its ratio to raw is what the runner adds (< 1), or what its workers win (> 1).
- runner workers=W batch_render: the same with each process's MuJoCo sub-envs drawn as tiles in one GL context,
  one pixel read per vector step (`env.batch_render`; sizes' `batch_render` lists which of false/true to run).
Every case renders the same states: software GL's cost per frame depends on the scene (HalfCheetah far from its
start renders 2× faster than near it), so the runners draw their policy noise from the same seeds and the raw
envs (seeded as the runners' sub-envs) replay the first runner's actions. The cases of one (env, num_envs) are
timed in turns, one chunk each per round, so load from elsewhere on the machine falls on all of them alike;
each value is the median over the rounds. Runner rows also say where the collect time went: act (policy
forward), step (less rendering), render.
"""
from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
from omegaconf import DictConfig

from rlfarm.bench.common import sizes
from rlfarm.envs.registry import is_mujoco
from rlfarm.envs.rendering import headless_rendering, limit_software_rendering, make_env, render_frame
from rlfarm.roles.env_runner import EnvRunner

UNIT = "env steps/s"
STAGES = ("act", "step", "render")


def run(cfg: DictConfig, device: str) -> list[dict]:
    size = sizes(cfg, device)
    headless_rendering()  # before `is_mujoco` imports MuJoCo
    limit_software_rendering(int(cfg.render_threads))
    torch.set_num_threads(1)  # as a runner acts (threads: 1); the raw rows' resizes (classic control) alike
    rows = []
    for name in size.envs:
        for num_envs in size.num_envs:
            rows += measure(str(name), cfg, size, int(num_envs))
    return rows


def measure(name: str, cfg: DictConfig, size: DictConfig, num_envs: int) -> list[dict]:
    """Rows of the raw env and of a runner per workers count, for `num_envs` sub-envs of env `name`."""
    env, steps = cfg.envs[name], int(size.chunk_steps)
    kwargs = dict(env.kwargs or {})
    raw_case = f"{name} x{num_envs} raw"
    raw = RawEnvs(str(env.id), kwargs, num_envs, int(size.frame_size), int(cfg.seed))
    settings = {runner_case(name, num_envs, workers, batch): (workers, batch)
                for workers in dict.fromkeys(min(int(w), num_envs) for w in size.workers)
                for batch in (size.get("batch_render", [False]) if is_mujoco(str(env.id)) else [False])}
    runners = {case: runner(str(env.id), kwargs, num_envs, workers, size, cfg, bool(batch))
               for case, (workers, batch) in settings.items()}
    try:
        # The raw envs go last in each round, replaying the actions the first runner took in it.
        actions = next(iter(runners.values())).buffers.action[:steps]
        works = {**{case: seeded_collect(r, steps) for case, r in runners.items()}, raw_case: lambda: raw.chunk(actions)}
        for work in works.values():
            work()  # warm-up: resets, first renders, the first policy forward
        before = {case: r.stats()["stage_s"] for case, r in runners.items()}
        rates = interleaved_rates(works, steps * num_envs, int(size.repeats))
        after = {case: r.stats()["stage_s"] for case, r in runners.items()}
    finally:
        raw.close()
        for r in runners.values():
            r.close()
    common = {"unit": UNIT, "num_envs": num_envs, "frame_size": int(size.frame_size)}
    rows = [{"case": raw_case, "value": rates[raw_case], "baseline": None, **common, "workers": None}]
    for case in runners:
        spent = {stage: after[case][stage] - before[case][stage] for stage in STAGES}
        shares = {f"{stage}_share": round(seconds / sum(spent.values()), 3) for stage, seconds in spent.items()}
        workers, batch = settings[case]
        rows.append({"case": case, "value": rates[case], "baseline": raw_case, **common,
                     "workers": workers, "batch_render": bool(batch), **shares})
    return rows


def runner_case(name: str, num_envs: int, workers: int, batch_render: bool) -> str:
    return f"{name} x{num_envs} runner workers={workers}" + (" batch_render" if batch_render else "")


def interleaved_rates(works: dict[str, Callable[[], object]], items: int, rounds: int) -> dict[str, float]:
    """Median items/s of each work over `rounds` rounds, every work timed once per round, in turn."""
    rates: dict[str, list[float]] = {case: [] for case in works}
    for _ in range(rounds):
        for case, work in works.items():
            started = time.perf_counter()
            work()
            rates[case].append(items / (time.perf_counter() - started))
    return {case: statistics.median(values) for case, values in rates.items()}


def seeded_collect(runner: EnvRunner, steps: int) -> Callable[[], object]:
    """runner.collect(steps), its policy noise seeded by the call's number: every runner case acts alike."""
    calls = itertools.count()

    def work():
        torch.manual_seed(next(calls))
        return runner.collect(steps)

    return work


class RawEnvs:
    """num_envs plain gymnasium envs, seeded as a runner's sub-envs, stepped and rendered one after another."""

    def __init__(self, env_id: str, kwargs: dict, num_envs: int, frame_size: int, seed: int):
        self.envs = [make_env(env_id, frame_size, kwargs) for _ in range(num_envs)]
        for i, env in enumerate(self.envs):
            env.reset(seed=seed + i)
        self.frame_size = frame_size

    def chunk(self, actions: np.ndarray) -> None:
        """Step every env through actions [steps, num_envs, ...], rendering each step."""
        for row in actions:
            for env, action in zip(self.envs, row):
                _, _, terminated, truncated, _ = env.step(action)
                render_frame(env, self.frame_size)
                if terminated or truncated:
                    env.reset()

    def close(self) -> None:
        for env in self.envs:
            env.close()


def runner(env_id: str, kwargs: dict, num_envs: int, workers: int, size: DictConfig, cfg: DictConfig,
           batch_render: bool = False) -> EnvRunner:
    """An EnvRunner built in this process, recording frames for a pixel reward model, acting with its policy."""
    actor = {"_target_": "rlfarm.models.mlp.SquashedGaussianActor", "_partial_": True,
             "hidden": list(cfg.actor_hidden)}
    env_cfg = {"id": env_id, "num_envs": num_envs, "workers": workers, "batch_render": batch_render, "kwargs": kwargs}
    return EnvRunner(0, env_cfg, actor, ["frames"], int(size.frame_size), int(cfg.seed), int(size.chunk_steps),
                     credits=1, random_steps=0, threads=1)

"""The SAC learner role with the neighbours it has inside the pipeline, on one device: which of them slows it.

In the 4-GPU pipeline the learner ran at 0.41× its bench (docs/benchmarks.md, issue 15). Its GPU also rendered for
a quarter of the runners (EGL contexts time-sliced with its CUDA context), and its process took in ~5,000
transitions/s (store calls on other threads, the GIL, host-to-device copies) while the driver polled its stats.
These rows put those neighbours back one at a time beside the role's own update loop, on one GPU:

- `role loop` (the baseline): the loop's per-burst work — store what arrived, one burst of updates in CUDA-graph
  groups, publish if due — timed over `seconds` of wall time, nothing beside it.
- `+ ingest`: a thread hands the role labeled chunks at `ingest_per_s` transitions/s (`store()`, the call the
  labelers make; chunks shaped as runners fill them: float64 observations, one chunk per `chunk` transitions) and
  another asks for `stats()` every second, as the driver does. In-process: Ray's own deserialization is not in it.
- `+ renderers`: `renderers` processes each run an env runner's collect path (`EnvRunner.collect`, no Ray:
  HalfCheetah, `renderer_envs` sub-envs, frames at `frame_size`, `env.batch_render`, the policy on CPU) as fast as
  they can, drawing through EGL on the learner's GPU, as a runner does when `env.render_gpus` includes it.
- `+ renderers + ingest`: both.

Each row also says how many frames/s the renderers drew and how many transitions/s were stored, so a row is
known to have had its neighbours."""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
import time

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from rlfarm.bench.common import synchronize

log = logging.getLogger("rlfarm")

UNIT = "updates/s"
RENDERER_START_S = 120.0  # a renderer imports torch and MuJoCo and makes its GL context: seconds under load


def measure_beside(learner, case: str, obs_dim: int, act_dim: int, beside: DictConfig, device: str) -> list[dict]:
    """Rows of `learner` (an SACLearner already captured, its buffer filled) with and without its neighbours."""
    seconds = float(beside.seconds)
    base = f"{case}/role loop"
    rows = [loop_row(learner, base, None, seconds, device)]
    feeder = Feeder(learner, obs_dim, act_dim, int(beside.ingest_per_s), int(beside.chunk))
    rows.append(loop_row(learner, f"{base} + ingest", base, seconds, device, feeder=feeder))
    if int(beside.renderers) > 0:
        with Renderers(int(beside.renderers), int(beside.renderer_envs), int(beside.frame_size), device) as renderers:
            rows.append(loop_row(learner, f"{base} + renderers", base, seconds, device, renderers=renderers))
            rows.append(loop_row(learner, f"{base} + renderers + ingest", base, seconds, device, feeder=feeder,
                                 renderers=renderers))
    for row in rows:
        log.info("%s: %.0f updates/s", row["case"], row["value"])
    return rows


def loop_row(learner, case: str, baseline: str | None, seconds: float, device: str, feeder: Feeder | None = None,
             renderers: Renderers | None = None) -> dict:
    """updates/s of the role's loop over `seconds`, with the given neighbours running throughout."""
    burst = learner.max_burst
    stored_before = learner.stored
    frames_before = renderers.frames() if renderers else 0
    stop = threading.Event()
    threads = [threading.Thread(target=work, args=(stop,), daemon=True)
               for work in ((feeder.feed, feeder.poll_stats) if feeder else ())]
    for thread in threads:
        thread.start()
    try:
        synchronize(device)
        started, updates = time.perf_counter(), learner.updates
        while time.perf_counter() - started < seconds:
            learner.store_arrived()
            learner.update_burst(burst)
        synchronize(device)
        elapsed = time.perf_counter() - started
        updates = learner.updates - updates
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    learner.store_arrived()  # what arrived after the clock stopped is not this row's
    row = {"case": case, "value": updates / elapsed, "unit": UNIT, "baseline": baseline, "seconds": round(elapsed, 2),
           "stored_per_s": round((learner.stored - stored_before) / elapsed, 1)}
    if renderers:
        row |= {"renderers": renderers.count, "frames_per_s": round((renderers.frames() - frames_before) / elapsed, 1)}
    if feeder:
        row |= {"ingest_per_s": feeder.rate}
    return row


class Feeder:
    """Labeled chunks into the learner at a fixed rate (its `store`), and a stats poll every second."""

    def __init__(self, learner, obs_dim: int, act_dim: int, rate: int, chunk: int):
        self.learner, self.rate, self.chunk = learner, rate, chunk
        rng = np.random.default_rng(0)
        # As runners fill chunks: float64 observations (the envs' dtype), float32 actions and rewards, bool flags.
        self.data = {"obs": rng.standard_normal((chunk, obs_dim)), "next_obs": rng.standard_normal((chunk, obs_dim)),
                     "action": rng.uniform(-1, 1, (chunk, act_dim)).astype(np.float32),
                     "reward": rng.standard_normal(chunk).astype(np.float32), "terminated": np.zeros(chunk, bool)}
        self.seq = 0

    def feed(self, stop: threading.Event) -> None:
        period = self.chunk / self.rate
        due = time.perf_counter()
        while not stop.is_set():
            self.seq += 1
            meta = {"runner": 0, "seq": self.seq, "size": self.chunk, "policy_version": self.learner.version}
            self.learner.store([(meta, {name: array.copy() for name, array in self.data.items()})])
            due += period
            stop.wait(max(0.0, due - time.perf_counter()))

    def poll_stats(self, stop: threading.Event) -> None:
        while not stop.wait(1.0):
            self.learner.stats()


class Renderers:
    """`count` processes running an env runner's collect path, rendering on the learner's GPU, until closed."""

    def __init__(self, count: int, num_envs: int, frame_size: int, device: str):
        self.count = count
        context = mp.get_context("spawn")  # a forked child would inherit this process's CUDA state
        self.stop = context.Event()
        self.ready = context.Semaphore(0)
        self.counters = [context.Value("q", 0) for _ in range(count)]
        egl_device = egl_device_of(device)
        self.processes = [context.Process(target=render_loop, daemon=True,
                                          args=(i, num_envs, frame_size, egl_device, self.stop, self.ready, counter))
                          for i, counter in enumerate(self.counters)]

    def __enter__(self) -> Renderers:
        for process in self.processes:
            process.start()
        deadline = time.monotonic() + RENDERER_START_S
        for _ in self.processes:
            if not self.ready.acquire(timeout=max(0.0, deadline - time.monotonic())):
                self.__exit__()
                raise RuntimeError(f"a renderer did not start within {RENDERER_START_S:.0f} s")
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for process in self.processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()

    def frames(self) -> int:
        return sum(counter.value for counter in self.counters)


def egl_device_of(device: str) -> str | None:
    """The EGL device index of the learner's GPU (the physical index: EGL does not read CUDA_VISIBLE_DEVICES);
    None on CPU, where rendering goes wherever MUJOCO_GL puts it."""
    if not device.startswith("cuda"):
        return None
    index = torch.device(device).index or 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",")[index] if visible else str(index)


def render_loop(index: int, num_envs: int, frame_size: int, egl_device: str | None, stop, ready, counter) -> None:
    """A runner's collect loop (policy on CPU, no CUDA context: as runners hold no GPU share) until `stop`."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    if egl_device is not None:
        os.environ["MUJOCO_EGL_DEVICE_ID"] = egl_device
    from rlfarm.bench.env import runner  # imports MuJoCo: after the environment is set

    cfg = OmegaConf.create({"actor_hidden": [256, 256], "seed": index})
    size = OmegaConf.create({"frame_size": frame_size, "chunk_steps": 8})
    env_runner = runner("HalfCheetah-v5", {}, num_envs, 0, size, cfg, batch_render=True)
    try:
        env_runner.collect(8)  # the first frames: GL context and buffers made
        ready.release()
        while not stop.is_set():
            env_runner.collect(8)
            with counter.get_lock():
                counter.value += 8 * num_envs
    finally:
        env_runner.close()

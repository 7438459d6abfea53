"""The benches' stand-ins: what plays a stage that a bench is *not* measuring, so that the stage it measures is the
bottleneck. The roles measured (Labeler, SACLearner, EnvRunner) are the real ones; only these stand in.

- `ChunkProducer` plays an env runner towards the labelers and the learner with pre-made chunks (`rlfarm bench
  labeler`, `rlfarm bench pipeline`'s farm row), with the runner's own credit logic (rlfarm/roles/credits.py).
- `InstantAck` plays the labelers and acks every chunk at once: what the runners could feed at most.
- `FixedCostEnv` is an env whose step costs a fixed CPU time: the CPU-bound env stage of `rlfarm bench pipeline`.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping

import gymnasium as gym
import numpy as np
import ray

from rlfarm.chunk import Chunk, ChunkMeta
from rlfarm.roles.base import role
from rlfarm.roles.credits import Credits
from rlfarm.roles.stage_clock import StageClock


@role("runner")
class ChunkProducer:
    """Plays an env runner towards the labelers and the learner (same chunk record, credits, acks, redispatch) but
    steps no env: its chunks are pre-made random arrays, put in the object store afresh for every send as a
    runner's are. So it can outrun a labeler, and a farm bench measures the farm, not the envs.

    fields: chunk field → (per-transition shape, numpy dtype name), e.g. {"frames": ([224, 224, 3], "uint8")}.
    """

    def __init__(self, index: int, fields: Mapping[str, tuple[list[int], str]], chunk_size: int, credits: int,
                 seed: int = 0, distinct_chunks: int = 2):
        rng = np.random.default_rng(seed + 7919 * index)
        self.index, self.chunk_size = index, chunk_size
        self.pool: list[Chunk] = [{key: _random_array(rng, (chunk_size, *shape), dtype)
                                   for key, (shape, dtype) in fields.items()} for _ in range(distinct_chunks)]
        self.credits = Credits(credits)
        self.stages = StageClock("credit_wait", "send")
        self._stop = threading.Event()
        self.labelers: list = []
        self.produced = self.chunks = 0

    def set_labelers(self, labelers: list) -> None:
        self.labelers = list(labelers)

    def receive_weights(self, published) -> int:
        """The learner publishes weights to its runners; nothing acts on them here: the chunks stay version 0."""
        return 0

    def ack(self, seqs: list[int], published=None) -> None:
        """The learner's ack (the weights it may carry are received as `receive_weights` receives them)."""
        if published is not None:
            self.receive_weights(published)
        self.credits.acked(seqs)

    def redispatch(self, labeler: int) -> int:
        return self.credits.redispatch(labeler, self.labelers)

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> dict:
        seq = 0
        while True:
            with self.stages.timing("credit_wait"):
                if not self.credits.take(self._stop):
                    return self.stats()
            with self.stages.timing("send"):
                meta = ChunkMeta(runner=self.index, seq=seq, incarnation=0, produced_at=time.time(), policy_version=0,
                                 size=self.chunk_size, envs=1)
                self.credits.send(meta, ray.put(self.pool[seq % len(self.pool)]), self.labelers)
            self.produced += self.chunk_size
            self.chunks += 1
            seq += 1

    def stats(self) -> dict:
        return {"runner": self.index, "pid": os.getpid(), "produced": self.produced, "chunks": self.chunks,
                "in_flight": len(self.credits), "stage_s": self.stages.snapshot()}


def _random_array(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    if dtype == "uint8":
        return rng.integers(0, 256, size=shape, dtype=np.uint8)
    if dtype == "bool":
        return np.zeros(shape, dtype=bool)
    return rng.standard_normal(shape).astype(dtype)


@role("labeler")
class InstantAck:
    """Stands where the labelers would and acks every chunk at once: the stage upstream, measured alone."""

    def __init__(self):
        self.runners: list = []
        self.received = 0

    def set_runners(self, runners: list) -> None:
        self.runners = list(runners)

    def submit(self, meta: ChunkMeta, chunk: Chunk) -> None:
        self.received += meta["size"]
        self.runners[meta["runner"]].ack.remote([meta["seq"]])

    def stats(self) -> dict:
        return {"received": self.received, "pid": os.getpid(), "stage_s": {}}


class FixedCostEnv(gym.Env):
    """obs: [obs_dim] float32 that drifts with the actions; reward −‖a‖²; never terminates (episodes are cut by the
    registered time limit). The step spins (it does not sleep), so it takes a core the way physics or rendering
    does, and N runners on N cores step at most N / step_cpu_ms. Registered as `rlfarm/FixedCost-v0`; runners make
    it from `MODULE_ENV_ID` (gymnasium imports this module first)."""

    def __init__(self, step_cpu_ms: float = 1.0, obs_dim: int = 8, act_dim: int = 2):
        self.step_s = float(step_cpu_ms) / 1e3
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (act_dim,), np.float32)
        self._obs = np.zeros(obs_dim, dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._obs = self.np_random.standard_normal(self._obs.shape).astype(np.float32)
        return self._obs.copy(), {}

    def step(self, action):
        deadline = time.perf_counter() + self.step_s
        while time.perf_counter() < deadline:  # spin: the cost is CPU time, as with a simulator
            pass
        action = np.asarray(action, dtype=np.float32).reshape(-1)
        self._obs = 0.9 * self._obs + 0.1 * np.resize(action, self._obs.shape)
        return self._obs.copy(), -float(np.square(action).sum()), False, False, {}


ENV_ID = "rlfarm/FixedCost-v0"
MODULE_ENV_ID = f"{__name__}:{ENV_ID}"

if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point=FixedCostEnv, max_episode_steps=1000)

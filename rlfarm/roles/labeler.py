"""Labeler role: one worker of the labeling farm. Chunks arrive on a bus; when the bus fires, the reward
model runs once over every transition it holds (one big batch on this labeler's GPU share), and the
labeled chunks go straight to the learner. The learner only ever sees rewards produced here."""
from __future__ import annotations

import threading
import time

import numpy as np
from hydra.utils import instantiate

from rlfarm.roles.bus import Bus
from rlfarm.roles.common import assigned_device, limit_threads

# What the learner stores of a chunk; everything else (frames, env reward) stays behind.
LEARNER_FIELDS = ("obs", "action", "next_obs", "terminated")


class Labeler:
    def __init__(self, index: int, reward_cfg: dict, bus_items: int, bus_timeout_s: float, threads: int = 1):
        limit_threads(threads)
        self.index = index
        self.device = assigned_device()
        self.model = instantiate(reward_cfg)
        self.model.setup(self.device)
        self.bus = Bus(bus_items, bus_timeout_s)
        self.learner = None
        self._stop = threading.Event()
        self.labeled = self.batches = 0
        self.busy_s = 0.0
        self.lag_sum_s = 0.0
        self.lag_count = 0

    def set_learner(self, learner) -> None:
        self.learner = learner

    def submit(self, meta: dict, chunk: dict) -> None:
        """Ray resolves the chunk ref before this runs, so the data is already local (zero-copy)."""
        self.bus.put((meta, chunk), units=meta["size"])

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> dict:
        while not self._stop.is_set():
            items = self.bus.take(wait_s=0.2)
            if items:
                self._label(items)
        leftover = self.bus.drain()
        if leftover:
            self._label(leftover)
        return {"labeler": self.index, "labeled": self.labeled}

    def _label(self, items: list[tuple[dict, dict]]) -> None:
        started = time.monotonic()
        batch = {key: np.concatenate([chunk[key] for _, chunk in items]) for key in self.model.needs}
        rewards = np.asarray(self.model(batch), dtype=np.float32).reshape(-1)
        self.busy_s += time.monotonic() - started
        labeled_at = time.time()
        out, start = [], 0
        for meta, chunk in items:
            n = meta["size"]
            labeled = {key: chunk[key] for key in LEARNER_FIELDS}
            labeled["reward"] = rewards[start:start + n]
            start += n
            out.append(({**meta, "labeled_at": labeled_at}, labeled))
            self.lag_sum_s += labeled_at - meta["produced_at"]
            self.lag_count += 1
        self.learner.store.remote(out)
        self.labeled += start
        self.batches += 1

    def stats(self) -> dict:
        lag = self.lag_sum_s / self.lag_count if self.lag_count else 0.0
        self.lag_sum_s, self.lag_count = 0.0, 0
        return {"labeler": self.index, "labeled": self.labeled, "batches": self.batches, "busy_s": self.busy_s,
                "labeling_lag_s": lag, "queued": len(self.bus), "device": self.device}

"""Labeler role: one worker of the labeling farm. Chunks arrive on a bus; when the bus fires, the reward
model runs once over every transition it holds (one big batch on this labeler's GPU share), and the
labeled chunks go straight to the learner. The learner only ever sees rewards produced here.

Reward-model faults never become silent zeros: a bus whose model call raises or returns NaN/inf is retried
once; if it fails again, its chunks are labeled one by one and each chunk that still fails is written to
`<run_dir>/quarantine/` with the error, counted, and reported to the learner (which returns its credit).

A model call that never returns cannot be cut short from inside (a wedged GPU, a hung remote model): `stats()`
answers on another thread of the threaded actor and reports how long the current call has run (`in_call_s`), so
the driver can name the labeler and have Ray restart it. Until WARMUP_CALLS calls have ended the labeler is not
"warm" (a compiled model compiles in its first call, and once more for dynamic shapes): the driver then allows
such a call as long as a restart (run.restart_timeout_s).

Calls overlap with the host work around them: a model that queues its work on a GPU (`RewardModel.start` returns
before the result is there) has one bus in flight while the labeler gathers and uploads the next, so the device does
not idle through the host's share of every bus (with 224-px frames, ~150 MB of copies per 1,024 transitions).
`stage_s` splits the labeler's time into "gather" (the bus's chunks into the model's batch), "launch" (starting the
model on it: kernel launches and graph replays; all of a call for a model that runs to the end in `start`), within it
"upload" and "upload_wait" for a model that stages its input (the host's copy into pinned buffers, and waiting for a
buffer's previous copy to the device), "model" (waiting for a call in flight; retries), "send" (handing labeled chunks
to the learner) and "idle" (waiting for a bus to fire with no call in flight)."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
from hydra.utils import instantiate

from rlfarm.chunk import LEARNED, Chunk, ChunkMeta
from rlfarm.rewards.base import Pending
from rlfarm.roles.base import role
from rlfarm.roles.bus import Bus
from rlfarm.roles.common import assigned_device, limit_threads
from rlfarm.roles.stage_clock import StageClock

WARMUP_CALLS = 8  # model calls that may take as long as a model load: a compiled model compiles again per new
                  # shape class (static, then dynamic batch sizes), and under CPU load each can take over a minute
Item = tuple[ChunkMeta, Chunk]  # a chunk on the bus


@role("labeler")
class Labeler:
    def __init__(self, index: int, reward_cfg: dict, bus_items: int, bus_timeout_s: float, threads: int = 1,
                 quarantine_dir: str | None = None):
        limit_threads(threads)
        self.index = index
        self.device = assigned_device()
        self.stages = StageClock("gather", "launch", "upload", "upload_wait", "model", "send", "idle")
        self.model = instantiate(_own_seed(reward_cfg, index))
        self.model.stages = self.stages  # the model may time parts of its own start (rlfarm/rewards/staging.py)
        self.model.setup(self.device)
        self.bus = Bus(bus_items, bus_timeout_s)
        self.learners: list = []
        self.incarnation = 0
        self._stop = threading.Event()
        self.quarantine_dir = Path(quarantine_dir) if quarantine_dir else None
        self.labeled = self.batches = self.quarantined = self.retries = 0
        self.last_error: str | None = None
        self._calls: list[float] = []  # monotonic starts of the model calls in progress, oldest first (at most 2)
        self.calls_ended = 0
        self.overlapped = 0  # calls started while an earlier one was still running (a model that queues its work)
        self.lag_sum_s = 0.0
        self.lag_count = 0

    def set_learner(self, learner, incarnation: int = 0) -> None:
        """`learner`: the learner, or its data-parallel ranks (a list: runner i's chunks go to rank i mod N).
        `incarnation` counts this labeler's restarts; deliveries carry it so the learner can tell the driver what a
        labeler did before it died."""
        self.learners = list(learner) if isinstance(learner, (list, tuple)) else [learner]
        self.incarnation = incarnation

    def _deliver(self, method: str, items: list) -> None:
        """learner.<method>(items), each item (a meta, or a (meta, chunk) pair) to the rank of its runner."""
        by_rank: dict[int, list] = {}
        for item in items:
            meta = item[0] if isinstance(item, tuple) else item
            by_rank.setdefault(meta["runner"] % len(self.learners), []).append(item)
        for rank, part in by_rank.items():
            getattr(self.learners[rank], method).remote(part)

    def submit(self, meta: ChunkMeta, chunk: Chunk) -> None:
        """Ray resolves the chunk ref before this runs, so the data is already local (zero-copy)."""
        self.bus.put((meta, chunk), units=meta["size"])

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> dict:
        flight = None  # (items, pending call, started): the bus the model is working on
        while not self._stop.is_set():
            if flight is None:
                items = self.stages.timed("idle", self.bus.take, wait_s=0.2)
                if items:
                    flight = self._start(items)
                continue
            items = []  # a call in flight: start the next bus if it fires before this call's result is there
            with self.stages.timing("model"):
                while not items and not flight[1].ready() and not self._stop.is_set():
                    items = self.bus.take(wait_s=0.002)
            following = self._start(items) if items else None
            self._finish(flight)
            flight = following
        if flight is not None:
            self._finish(flight)
        leftover = self.bus.drain()
        if leftover:
            self._finish(self._start(leftover))
        return {"labeler": self.index, "labeled": self.labeled}

    def _batch(self, items: list[Item]) -> dict[str, np.ndarray | list[np.ndarray]]:
        """What the model reads of the bus: per key, the chunks' arrays joined, or as they came for the keys the
        model copies into its own staging anyway (`takes_parts`: one host copy of a bus's frames instead of two)."""
        batch = {}
        for key in self.model.needs:
            parts = [chunk[key] for _, chunk in items]
            batch[key] = parts if key in getattr(self.model, "takes_parts", ()) else np.concatenate(parts)
        return batch

    def _start(self, items: list[Item]) -> tuple:
        """Gather the bus and start the model on it; a call that raises here is retried in `_finish`."""
        started = time.monotonic()
        self.overlapped += bool(self._calls)
        self._calls.append(started)
        try:
            batch = self.stages.timed("gather", self._batch, items)
            with self.stages.timing("launch"):
                # a model written against the older interface (needs, setup, __call__ only) runs to the end here
                pending = self.model.start(batch) if hasattr(self.model, "start") else Pending(self.model(batch))
        except Exception as error:
            pending = _Failed(error)
        return items, pending, started

    def _finish(self, flight: tuple) -> None:
        """Take the call's result (waiting for it), check it, and send the labeled chunks; a call that raised or
        returned unusable rewards is retried once, then its chunks are labeled one by one."""
        items, pending, started = flight
        with self.stages.timing("model"):
            rewards = self._result(items, pending)
        if rewards is None:
            self.stages.timed("model", self._label_one_by_one, items)  # retries count as model time
            self._call_ended(started)
            return
        self._call_ended(started)
        self.stages.timed("send", self._send, items, rewards)

    def _result(self, items: list[Item], pending: Pending) -> np.ndarray | None:
        """The call's checked rewards, after one retry of a call that raised or returned unusable rewards (transient
        faults, OOM spikes and flaky remote models, pass); None when the retry failed too."""
        try:
            return self._checked(items, pending.result())
        except Exception as first:
            self.retries += 1
            self.last_error = _one_line(first)
        try:
            return self._rewards(items)
        except Exception:
            return None

    def _call_ended(self, started: float) -> None:
        self.calls_ended += 1
        self._calls.remove(started)  # a call started after this one now counts from its own start

    def _rewards(self, items: list[Item]) -> np.ndarray:
        """Run the model once over the items, to the end; raise on an exception or on unusable rewards."""
        return self._checked(items, self.model(self._batch(items)))

    @staticmethod
    def _checked(items: list[Item], rewards) -> np.ndarray:
        rewards = np.asarray(rewards, dtype=np.float32).reshape(-1)
        if rewards.shape[0] != sum(meta["size"] for meta, _ in items):
            raise ValueError(f"reward model returned {rewards.shape[0]} rewards for {sum(m['size'] for m, _ in items)} transitions")
        if not np.isfinite(rewards).all():
            raise FloatingPointError(f"reward model returned {int((~np.isfinite(rewards)).sum())} NaN/inf rewards")
        return rewards

    def _label_one_by_one(self, items: list[Item]) -> None:
        """Isolate the chunks that break the model; label the rest, quarantine those."""
        good, bad = [], []
        for item in items:
            try:
                good.append((item, self._rewards([item])))
            except Exception as error:
                bad.append((item, _one_line(error)))
        if good:
            self._send([item for item, _ in good], np.concatenate([r for _, r in good]))
        if bad:
            for (meta, chunk), error in bad:
                self._quarantine(meta, chunk, error)
            self._deliver("quarantined", [meta for (meta, _), _ in bad])

    def _quarantine(self, meta: ChunkMeta, chunk: Chunk, error: str) -> None:
        self.quarantined += meta["size"]
        self.last_error = error
        if self.quarantine_dir is None:
            return
        self.quarantine_dir.mkdir(parents=True, exist_ok=True)
        stem = self.quarantine_dir / f"runner{meta['runner']}_seq{meta['seq']}"
        np.savez_compressed(f"{stem}.npz", **{k: np.asarray(v) for k, v in chunk.items()})
        Path(f"{stem}.json").write_text(json.dumps({**meta, "error": error, "labeler": self.index}, indent=1))

    def _send(self, items: list[Item], rewards: np.ndarray) -> None:
        labeled_at = time.time()
        out, start = [], 0
        for meta, chunk in items:
            n = meta["size"]
            labeled: Chunk = {key: chunk[key] for key in LEARNED if key in chunk}  # frames stay here
            labeled["reward"] = rewards[start:start + n]
            start += n
            labeled_meta: ChunkMeta = {**meta, "labeled_at": labeled_at, "labeled_by": (self.index, self.incarnation)}
            out.append((labeled_meta, labeled))
            self.lag_sum_s += labeled_at - meta["produced_at"]
            self.lag_count += 1
        self._deliver("store", out)
        self.labeled += start
        self.batches += 1

    def stats(self) -> dict:
        lag = self.lag_sum_s / self.lag_count if self.lag_count else 0.0
        self.lag_sum_s, self.lag_count = 0.0, 0
        calls = list(self._calls)  # a copy: the run thread may end a call meanwhile
        stage_s = self.stages.snapshot()
        busy_s = sum(seconds for stage, seconds in stage_s.items() if stage != "idle")
        return {"labeler": self.index, "pid": os.getpid(), "labeled": self.labeled, "batches": self.batches, "busy_s": busy_s,
                "overlapped": self.overlapped, "stage_s": stage_s,
                "in_call_s": time.monotonic() - calls[0] if calls else 0.0,
                "warm": self.calls_ended >= WARMUP_CALLS,
                "labeling_lag_s": lag, "queued": len(self.bus), "device": self.device,
                "quarantined": self.quarantined, "retries": self.retries, "last_error": self.last_error,
                "reward_model": self.model.stats() if hasattr(self.model, "stats") else {}}  # e.g. a distilled reward's


def _own_seed(reward_cfg: dict, index: int) -> dict:
    """A reward model that draws random numbers (`seed`: a distilled reward's teacher share and student) gets a seed of
    its own per labeler, so two labelers do not pick the same frames of every bus and start the same student."""
    return {**reward_cfg, "seed": int(reward_cfg["seed"]) + index} if reward_cfg.get("seed") is not None else reward_cfg


class _Failed(Pending):
    """A call that raised as it started: its result raises the same error (and the bus is retried)."""

    def __init__(self, error: Exception):
        self.error = error

    def result(self) -> np.ndarray:
        raise self.error


def _one_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"

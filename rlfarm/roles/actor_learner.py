"""Actor-learner role (IMPALA, APPO): trains on the runners' trajectories as they arrive, whatever weights the
runners acted with, and corrects for the lag with V-trace (rlfarm/algos/vtrace_agent.py).

Labeled chunks queue here in arrival order; every `batch_chunks` of them make one batch (one `epochs`-step update),
and a chunk's credit goes back to its runner once a batch used it, so a runner is never more than `credits` chunks
ahead of the learner. Policy lag (how many weight versions the learner published since the runner's) is measured
when a batch takes a chunk: a chunk more than `max_policy_lag` versions old is dropped, counted, and its credit
returned, so every trained-on chunk is within the bound. Storage, acks, publication and checkpoints are the farm
learners' shared machinery (rlfarm/roles/chunk_learner.py); queued chunks are not checkpointed (a resume starts
with fresh ones: on-policy data from an old policy is what V-trace corrects least well)."""
from __future__ import annotations

from collections import deque

import numpy as np
from hydra.utils import instantiate

from rlfarm.algos.vtrace_agent import BatchStaging, VTraceAgent, VTraceConfig, trajectories
from rlfarm.roles.chunk_learner import ChunkLearner
from rlfarm.roles.common import assigned_device, limit_threads, seed_everything


class ActorLearner(ChunkLearner):
    def __init__(self, algo_cfg: dict, model_cfg: dict, spaces: dict, seed: int, threads: int = 1,
                 device: str | None = None):
        limit_threads(threads)
        seed_everything(seed)
        self.device = device or assigned_device()
        model = instantiate(model_cfg["actor"])(spaces["obs_dim"], spaces["act_dim"], spaces["action_low"],
                                                spaces["action_high"])
        super().__init__(VTraceAgent(model, VTraceConfig.from_mapping(algo_cfg), self.device),
                         int(algo_cfg["publish_every"]))
        self.batch_chunks, self.max_policy_lag = int(algo_cfg["batch_chunks"]), int(algo_cfg["max_policy_lag"])
        self.queue: deque[tuple[dict, dict]] = deque()  # stored chunks no batch has taken yet
        self.queued = 0  # their transitions
        self.dropped_chunks = self.dropped_transitions = 0
        self._lags: list[int] = []  # of the chunks batches took since the last stats()
        self.staging = BatchStaging(self.agent.device)

    def _take(self, meta: dict, chunk: dict) -> None:
        self.queue.append((meta, chunk))
        self.queued += meta["size"]
        return None  # acked once a batch takes it (or drops it)

    def _updates_owed(self) -> int:
        """Full batches waiting; stopping, what is left makes one last, smaller batch."""
        owed = len(self.queue) // self.batch_chunks
        return owed if owed or not self._stop.is_set() else min(len(self.queue), 1)

    def _update(self, n: int) -> None:
        for _ in range(n):
            batch = self._next_batch()
            if batch:
                self._last_metrics = self.agent.update(trajectories(batch, self.staging))
                self.updates += 1
            for meta, _ in batch:  # their credits go back with the next ack
                self.unacked.append((meta["runner"], meta["seq"], self.updates))

    def _next_batch(self) -> list[tuple[dict, dict]]:
        """Up to batch_chunks queued chunks within the lag bound, oldest first; older ones are dropped on the way."""
        batch = []
        while self.queue and len(batch) < self.batch_chunks:
            meta, chunk = self.queue.popleft()
            self.queued -= meta["size"]
            lag = self.version - meta["policy_version"]
            if lag > self.max_policy_lag:
                self.dropped_chunks += 1
                self.dropped_transitions += meta["size"]
                self.unacked.append((meta["runner"], meta["seq"], self.updates))
                continue
            self._lags.append(lag)
            batch.append((meta, chunk))
        return batch

    def _algo_stats(self) -> dict:
        lags, self._lags = self._lags, []
        return {"buffer_size": self.queued, "chunks_dropped_lag": self.dropped_chunks,
                "transitions_dropped_lag": self.dropped_transitions,
                "policy_lag_mean": float(np.mean(lags)) if lags else None,
                "policy_lag_max": int(max(lags)) if lags else None}

    def _agent_snapshot(self, with_buffer: bool) -> dict:
        return {**super()._agent_snapshot(with_buffer), "dropped": [self.dropped_chunks, self.dropped_transitions]}

    def _agent_restore(self, state: dict) -> None:
        super()._agent_restore(state)
        self.dropped_chunks, self.dropped_transitions = (int(x) for x in state.get("dropped", (0, 0)))
        self.queue.clear()
        self.queued = 0


"""Actor-learner role (IMPALA, APPO): trains on the runners' trajectories as they arrive, whatever weights the
runners acted with, and corrects for the lag with V-trace (rlfarm/algos/vtrace_agent.py).

Labeled chunks queue here in arrival order; every `batch_chunks` of them make one batch (one `epochs`-step update),
and a chunk's credit goes back to its runner once a batch used it, so a runner is never more than `credits` chunks
ahead of the learner. Policy lag (how many weight versions the learner published since the runner's) is measured
when a batch takes a chunk: a chunk more than `max_policy_lag` versions old is dropped, counted, and its credit
returned, so every trained-on chunk is within the bound. Storage, acks, publication and checkpoints are the farm
learners' shared machinery (rlfarm/roles/chunk_learner.py); queued chunks are not checkpointed (a resume starts
with fresh ones: on-policy data from an old policy is what V-trace corrects least well).

Data-parallel ranks (`topology.roles.learner.count` = N > 1, one GPU each): N of these actors, rank r the learner of
the runners whose index is r mod N (labelers route each chunk there), each with its own queue, acks and weights out.
They train in lockstep: before each burst they agree (a gloo all-reduce) on the updates every one of them has full
batches for, and each update's gradients are averaged over the ranks (one flat all-reduce, NCCL on GPUs), so the
weights stay identical and one update trains on N batches. The driver holds the ranks as one group
(rlfarm/loops/learner_group.py): it starts, stops and watches each, adds their counts to rank 0's
(`merge_rank_stats`), and has rank 0 write their counters (`save_part`) into its checkpoint beside the shared weights.
Stopping, a rank's leftover chunks (fewer than a batch, or batches another rank cannot match) are acked untrained."""
from __future__ import annotations

from collections import deque

import numpy as np
import ray
import torch
import torch.distributed as dist
from hydra.utils import instantiate

from rlfarm.algos.vtrace_agent import BatchStaging, VTraceAgent, VTraceConfig, trajectories
from rlfarm.data_parallel import average_gradients, broadcast_parameters, join_data_parallel
from rlfarm.roles.base import role
from rlfarm.roles.chunk_learner import ChunkLearner
from rlfarm.roles.common import assigned_device, limit_threads, seed_everything, serve_rendezvous_here

# Counts the ranks report apart and the run reports summed (the rest of a metrics row is rank 0's own).
SUMMED = ("stored", "duplicates", "duplicate_transitions", "quarantined", "buffer_size", "owed", "chunks_dropped_lag",
          "transitions_dropped_lag")


@role("learner")
class ActorLearner(ChunkLearner):
    def __init__(self, algo_cfg: dict, model_cfg: dict, spaces: dict, seed: int, threads: int = 1,
                 device: str | None = None, rank: int = 0, world_size: int = 1):
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
        self.rank, self.world_size = int(rank), int(world_size)
        self._control: dist.ProcessGroup | None = None  # world_size > 1: the gloo group the ranks agree through
        self._rendezvous = None

    # -- data-parallel ranks --------------------------------------------------------------------------
    def open_data_parallel(self) -> str:
        """Rank 0: serve the group's rendezvous; returns the address the other ranks join."""
        self._rendezvous, address = serve_rendezvous_here(self.world_size)
        return address

    def join_data_parallel(self, address: str) -> int:
        """Join the group (every rank at once), take rank 0's weights, average gradients from now on. Returns the GPU
        Ray gave this rank (-1: none), so the caller can check that no two ranks share one."""
        join_data_parallel(self._rendezvous if self.rank == 0 else address, self.rank, self.world_size,
                           self.agent.device)
        self._control = dist.new_group(backend="gloo")  # per-burst agreement on the host: no GPU sync for it
        broadcast_parameters(self.agent.actor)
        self.agent.average_gradients = lambda parameters: average_gradients(parameters, self.world_size)
        gpu_ids = ray.get_gpu_ids() if ray.is_initialized() else []
        return int(gpu_ids[0]) if gpu_ids else -1

    def run(self) -> dict:
        result = super().run()
        self._release_leftovers()
        return result

    def _plan(self, owed: int) -> tuple[int, bool]:
        """One rank: the shared rule. N ranks: the burst every rank has batches for, and done once all are stopping
        with nothing arriving and no burst left in common (one all-reduce, so all decide alike in the same iteration)."""
        if self._control is None:
            return super()._plan(owed)
        mine = torch.tensor([self._burst(owed), int(self._stop.is_set() and self.inbox.empty())])
        dist.all_reduce(mine, op=dist.ReduceOp.MIN, group=self._control)
        burst, all_stopping = int(mine[0]), bool(mine[1])
        return burst, all_stopping and burst == 0

    def _release_leftovers(self) -> None:
        """Chunks still queued when the loop ended (N ranks: no common batch left for them): their credits go back."""
        while self.queue:
            meta, _ = self.queue.popleft()
            self.queued -= meta["size"]
            self.unacked.append((meta["runner"], meta["seq"], self.updates))
        self._ack_paid()

    def _take(self, meta: dict, chunk: dict) -> None:
        self.queue.append((meta, chunk))
        self.queued += meta["size"]
        return None  # acked once a batch takes it (or drops it)

    def _updates_owed(self) -> int:
        """Full batches of chunks within the lag bound (the stale ones are dropped as batches pass them; the version
        does not change within a burst, so every batch of a burst is whole: N ranks must all update, each on a whole
        batch); stopping, what is left makes one last, smaller batch (one rank only: N ranks train on batches of one
        size). Also read by stats() from another thread: it only reads a snapshot of the queue."""
        fresh = sum(self.version - meta["policy_version"] <= self.max_policy_lag for meta, _ in list(self.queue))
        owed = fresh // self.batch_chunks
        return owed if owed or not self._stop.is_set() or self.world_size > 1 else min(fresh, 1)

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

    def _counters(self) -> dict:
        return {**super()._counters(), "dropped": [self.dropped_chunks, self.dropped_transitions]}

    def _restore(self, state: dict, counters: dict | None = None) -> None:
        super()._restore(state, counters)
        self.dropped_chunks, self.dropped_transitions = (int(x) for x in (counters or state).get("dropped", (0, 0)))
        self.queue.clear()
        self.queued = 0

    # -- a rank's part of the group's checkpoint ---------------------------------------------------------
    def save_part(self) -> dict:
        """Rank r > 0: its counters at its next burst boundary, which rank 0's `save` writes beside the shared
        weights (the driver hands them over, rlfarm/loops/learner_group.py)."""
        return self._at_burst_boundary(self._counters)

    def load(self, path: str) -> dict:
        """Rank 0 restores the whole checkpoint; rank r > 0 rank 0's weights and optimizer with its own counters
        (none from a run with fewer ranks). Returns the driver's `extra`."""
        if self.rank == 0:
            return super().load(path)
        state = torch.load(path, map_location=self.device, weights_only=True)
        parts = state.get("ranks") or []
        counters = parts[self.rank - 1] if self.rank - 1 < len(parts) else \
            {"stored": 0, "duplicates": 0, "quarantined": 0, "stored_ids": []}
        self._at_burst_boundary(lambda: self._restore(state, counters))
        return state["extra"]

    @staticmethod
    def merge_rank_stats(lead: dict, others: list[dict]) -> dict:
        """Rank 0's stats with the other ranks' counts added: transitions stored, settled per runner and delivered per
        labeler, queued, dropped; the worst policy lag. Losses, stage times and progress are rank 0's (the ranks move in
        lockstep: one that stalls stalls rank 0). A rank that has not answered yet ({}) adds nothing."""
        merged = dict(lead)
        everyone = [lead, *others]
        for key in SUMMED:
            if key in lead:
                merged[key] = sum(s.get(key) or 0 for s in everyone)
        for key in ("settled_by_runner", "delivered_by_labeler"):
            total: dict = {}
            for s in everyone:
                for k, v in s.get(key, {}).items():
                    total[k] = total.get(k, 0) + v
            merged[key] = total
        lags = [s["policy_lag_max"] for s in everyone if s.get("policy_lag_max") is not None]
        means = [s["policy_lag_mean"] for s in everyone if s.get("policy_lag_mean") is not None]
        merged["policy_lag_max"] = max(lags) if lags else None
        merged["policy_lag_mean"] = float(np.mean(means)) if means else None
        merged["learner_ranks"] = len(everyone)
        return merged


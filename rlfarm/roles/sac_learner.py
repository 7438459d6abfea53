"""SAC learner role: the algorithm, its replay buffer (in this process, so sampling is a local gather) and the
update schedule (on CUDA the updates run in CUDA-graph groups: `rlfarm.algos.sac_graph.ReplayUpdates`, held
here, not by the agent). Labeled chunks arrive from labelers; each chunk id is stored once (exactly-once storage
even if a chunk is re-sent). Updates follow the update-to-data ratio and never run ahead of stored data;
a chunk's credit goes back to its runner once the updates it owes are done, which keeps acting, labeling
and learning within a few chunks of each other. Every `publish_every` updates the actor's weights are
put in the object store once (versioned) and the ref is pushed to the runners."""
from __future__ import annotations

import math
import os
import queue
import threading
import time
from collections import defaultdict, deque

import numpy as np
import torch
from hydra.utils import instantiate

from rlfarm.algos.sac_graph import ReplayUpdates
from rlfarm.buffers.replay import ReplayBuffer
from rlfarm.buffers.sampler import UniformSampler
from rlfarm.buffers.storage import TensorStorage
from rlfarm.roles.common import assigned_device, limit_threads, save_atomic, seed_everything
from rlfarm.roles.versioned_weights import Publication, publication

UPDATES_PER_BURST = 8  # updates between looks at the inbox: small enough to ack and publish promptly
GRAPHED_BURST = 32     # with CUDA graphs (8 updates per replay) a burst of 8 is short: look less often


class SACLearner:
    def __init__(self, algo_cfg: dict, model_cfg: dict, spaces: dict, seed: int, threads: int = 1):
        limit_threads(threads)
        seed_everything(seed)
        self.device = assigned_device()
        self.utd_ratio = float(algo_cfg["utd_ratio"])
        self.learning_starts = int(algo_cfg["learning_starts"])
        self.publish_every = int(algo_cfg["publish_every"])
        # graph_updates and compile configure this role's update path, not the agent: they sit in the agent's
        # config node so that one override names them (algo.agent.graph_updates)
        agent_cfg = dict(algo_cfg["agent"])
        graph_updates, compile = int(agent_cfg.pop("graph_updates", 0)), bool(agent_cfg.pop("compile", False))
        self.agent = instantiate(agent_cfg)(
            spaces["obs_dim"], spaces["act_dim"], spaces["action_low"], spaces["action_high"],
            actor=instantiate(model_cfg["actor"]), critic=instantiate(model_cfg["critic"]), device=self.device)
        self.buffer = ReplayBuffer(TensorStorage(int(algo_cfg["buffer_size"]), self.device),
                                   UniformSampler(int(algo_cfg["batch_size"]), generator_seed=seed))
        # On CUDA the eager update is launch-bound; captured in CUDA graphs (graph_updates per replay) it runs many
        # times faster (docs/benchmarks.md). On CPU the eager path stays: every update samples with the seeded
        # sampler, so CPU runs are reproducible.
        self.graphed = (ReplayUpdates(self.agent, self.buffer, graph_updates, compile)
                        if graph_updates > 0 and self.agent.device.type == "cuda" else None)
        self.inbox: queue.Queue = queue.Queue()
        self.stored_ids: set[tuple[int, int]] = set()
        self.quarantined_ids: set[tuple[int, int]] = set()
        self.quarantined_transitions = 0
        self.unacked: deque[tuple[int, int, int]] = deque()  # (runner, seq, updates required)
        self.runners: list = []
        self._published: Publication | None = None
        # Per worker incarnation, so the driver can account for what a worker did before it died:
        # transitions settled (stored or quarantined) per (runner, incarnation), delivered per (labeler, incarnation).
        self.settled_by_runner: dict[tuple[int, int], int] = defaultdict(int)
        self.delivered_by_labeler: dict[tuple[int, int], int] = defaultdict(int)
        self.duplicate_transitions = 0
        self._stop = threading.Event()
        self._state_lock = threading.Lock()
        self.stored = self.duplicates = self.updates = self.version = 0
        self.update_time_s = 0.0
        self._last_metrics: dict[str, torch.Tensor] = {}
        self._staleness: list[int] = []

    def set_runners(self, runners: list) -> None:
        self.runners = list(runners)
        self._publish()  # version 1 = the initial weights, so runners and learner start identical

    # -- called by labelers ------------------------------------------------------------------------
    def store(self, labeled: list[tuple[dict, dict]]) -> None:
        self.inbox.put(labeled)

    def quarantined(self, metas: list[dict]) -> None:
        """Chunks a labeler could not label: never stored, but their credits go back to the runners."""
        self.inbox.put([(meta, None) for meta in metas])

    # -- the update loop -----------------------------------------------------------------------------
    def run(self) -> dict:
        while True:
            with self._state_lock:  # a checkpoint (another thread) sees the state between bursts only
                self._drain_inbox()
                owed = self._updates_owed()
                if owed > 0:
                    self._update(min(owed, GRAPHED_BURST if self.graphed else UPDATES_PER_BURST))
                self._ack_paid()
            if owed <= 0:
                if self._stop.is_set() and self.inbox.empty():
                    break
                self._wait_for_data()
        return {"updates": self.updates, "stored": self.stored}

    def stop(self) -> None:
        """Finish the owed updates on what is stored, then return from run()."""
        self._stop.set()

    def _wait_for_data(self) -> None:
        try:
            labeled = self.inbox.get(timeout=0.05)
        except queue.Empty:
            return
        with self._state_lock:
            self._store(labeled)

    def _drain_inbox(self) -> None:
        while True:
            try:
                self._store(self.inbox.get_nowait())
            except queue.Empty:
                return

    def _store(self, labeled: list[tuple[dict, dict]]) -> None:
        for meta, chunk in labeled:
            chunk_id = (meta["runner"], meta["seq"])
            runner_incarnation = (meta["runner"], meta.get("incarnation", 0))
            if chunk is None:  # quarantined by a labeler
                if chunk_id not in self.quarantined_ids and chunk_id not in self.stored_ids:
                    self.quarantined_ids.add(chunk_id)
                    self.quarantined_transitions += meta["size"]
                    self.settled_by_runner[runner_incarnation] += meta["size"]
                self.unacked.append((*chunk_id, 0))
                continue
            if "labeled_by" in meta:
                self.delivered_by_labeler[tuple(meta["labeled_by"])] += meta["size"]
            if chunk_id in self.stored_ids:  # re-sent after a labeler restart: labeled twice, stored once
                self.duplicates += 1
                self.duplicate_transitions += meta["size"]
                self.unacked.append((*chunk_id, 0))  # re-ack: the runner may still hold its credit
                continue
            self.stored_ids.add(chunk_id)
            self.settled_by_runner[runner_incarnation] += meta["size"]
            self.buffer.extend({
                "obs": chunk["obs"].reshape(meta["size"], -1).astype(np.float32),
                "action": chunk["action"].reshape(meta["size"], -1).astype(np.float32),
                "reward": chunk["reward"].astype(np.float32),
                "next_obs": chunk["next_obs"].reshape(meta["size"], -1).astype(np.float32),
                "terminated": chunk["terminated"].astype(np.float32),
            })
            self.stored += meta["size"]
            self._staleness.append(self.version - meta["policy_version"])
            self.unacked.append((*chunk_id, self._required_updates(self.stored)))

    def _required_updates(self, stored: int) -> int:
        if stored < self.learning_starts:
            return 0
        return math.floor(self.utd_ratio * (stored - self.learning_starts + 1))

    def _updates_owed(self) -> int:
        return self._required_updates(self.stored) - self.updates

    def _update(self, n: int) -> None:
        started = time.perf_counter()
        if self.graphed:  # K updates per CUDA-graph replay, sampling on the device (rlfarm/algos/sac_graph.py)
            before = self.updates
            self._last_metrics = self.graphed(n)
            self.updates += n
            if self.updates // self.publish_every > before // self.publish_every:
                self._publish()
        else:
            for _ in range(n):
                self._last_metrics = self.agent.update(self.buffer.sample())
                self.updates += 1
                if self.updates % self.publish_every == 0:
                    self._publish()
        self.update_time_s += time.perf_counter() - started

    def _ack_paid(self) -> None:
        paid: dict[int, list[int]] = defaultdict(list)
        while self.unacked and self.unacked[0][2] <= self.updates:
            runner, seq, _ = self.unacked.popleft()
            paid[runner].append(seq)
        for runner, seqs in paid.items():
            self.runners[runner].ack.remote(seqs)

    def _publish(self) -> None:
        self.version += 1
        self._published = publication(self.agent.policy_state(), self.version)
        self.push_weights()

    def push_weights(self) -> None:
        """Send the newest published weights to every runner (again): a restarted runner starts with none."""
        for runner in self.runners:
            runner.set_weights.remote(self._published)

    # -- reporting / persistence ---------------------------------------------------------------------
    def stats(self) -> dict:
        metrics = {k: float(v) for k, v in self._last_metrics.items()}
        staleness, self._staleness = self._staleness, []
        return {"pid": os.getpid(), "stored": self.stored, "updates": self.updates, "duplicates": self.duplicates,
                "duplicate_transitions": self.duplicate_transitions,
                "settled_by_runner": dict(self.settled_by_runner),
                "delivered_by_labeler": dict(self.delivered_by_labeler),
                "quarantined": self.quarantined_transitions,
                "buffer_size": len(self.buffer), "policy_version": self.version, "update_time_s": self.update_time_s,
                "policy_staleness": float(np.mean(staleness)) if staleness else 0.0, "device": self.device, **metrics}

    def save(self, path: str, with_buffer: bool = True, extra: dict | None = None) -> str:
        """Atomic checkpoint (write a temp file, then rename): networks, optimizers, entropy temperature,
        counters, stored chunk ids, RNG states, the replay buffer (optional) and the driver's `extra` state."""
        with self._state_lock:
            state = {"agent": self.agent.state_dict(), "stored": self.stored, "updates": self.updates,
                     "version": self.version, "duplicates": self.duplicates,
                     "quarantined": self.quarantined_transitions,
                     "stored_ids": [list(i) for i in sorted(self.stored_ids)],
                     "torch_rng": torch.get_rng_state(), "extra": extra or {}}
            if with_buffer:
                state["buffer"] = self.buffer.state_dict()
            return save_atomic(state, path)

    def load(self, path: str) -> dict:
        """Restore a checkpoint written by `save` (weights_only: no code runs from the file). Returns `extra`."""
        state = torch.load(path, map_location=self.device, weights_only=True)
        with self._state_lock:
            self.agent.load_state_dict(state["agent"])
            if self.graphed:  # the optimizers' state tensors are new: a captured graph would update the old ones
                self.graphed.reset()
            self.stored, self.updates, self.version = int(state["stored"]), int(state["updates"]), int(state["version"])
            self.duplicates, self.quarantined_transitions = int(state["duplicates"]), int(state["quarantined"])
            self.stored_ids = {tuple(i) for i in state["stored_ids"]}
            torch.set_rng_state(state["torch_rng"].cpu())
            if "buffer" in state:
                self.buffer.load_state_dict(state["buffer"])
        self._publish()  # runners act with the restored policy from their first chunk
        return state["extra"]

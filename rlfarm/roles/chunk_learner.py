"""What every learner fed by the labeling farm shares (SAC, IMPALA, APPO): labeled chunks in, exactly-once storage,
credits back to the runners, versioned weights out, checkpoints served between bursts.

Labeled chunks arrive from labelers; each chunk id is stored once (a chunk re-sent after a labeler restart is
counted, not stored again). A chunk's credit goes back to its runner once the learner has done what the chunk owes
(`_take` says when: SAC, after the updates its update-to-data ratio owes; an actor-learner, once a batch consumed
it), which keeps acting, labeling and learning within a few chunks of each other.

One thread, the update loop (`run`), owns the agent, its data and the counters; it works in bursts of a few
updates and, between bursts, stores what arrived, acks runners and serves checkpoint requests. No other thread
waits on a lock the loop holds through a burst: a checkpoint (or a load) is a request the loop serves at its
next burst boundary (a snapshot in memory; the file is written by the calling thread), so it waits for one
burst, never for the data to stop. (It used to take a lock the loop re-took right after every burst; Python
locks are not fair, so while updates were owed a save got it only by chance: the 4x H100 freeze, issue 15.)

Weights: every `publish_every` updates the actor's weights are copied off the device without stopping the
update stream and put in the object store once (versioned) by a publishing thread (`rlfarm.sync.WeightPublisher`);
a runner gets the newest publication with its next ack (`runner.ack.remote(seqs, published)`), and all runners get
it (`runner.receive_weights.remote(published)`) at the start, after a load and on `push_weights` (a restarted
runner).

A subclass supplies the algorithm: `_take` (keep a chunk's data), `_updates_owed`, `_update(n)`, and what its
checkpoints and stats hold beyond the shared counters (`_agent_snapshot`, `_agent_restore`, `_algo_stats`)."""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable

import numpy as np
import torch

from rlfarm.chunk import Chunk, ChunkMeta
from rlfarm.roles.common import save_atomic
from rlfarm.roles.loop_request import LoopRequest
from rlfarm.roles.stage_clock import StageClock
from rlfarm.sync.base import Publication
from rlfarm.sync.publisher import WeightPublisher

log = logging.getLogger("rlfarm")

UPDATES_PER_BURST = 8  # updates between looks at the inbox: small enough to ack and publish promptly
IDLE_WAIT_S = 0.05     # how long the loop waits for data when it has nothing to do
SAVE_SNAPSHOT_WAIT_S = 5.0  # a save waits this long for a burst boundary, then snapshots mid-burst
STAGES = ("update", "store", "publish", "idle", "checkpoint")


class ChunkLearner:
    """The shared machinery; `agent` has `.actor` (the module runners act with), `.device`, `policy_state()`,
    `state_dict()` and `load_state_dict()`. A subclass registers as a learner role (`@role("learner")`)."""

    def __init__(self, agent, publish_every: int):
        self.agent, self.publish_every = agent, int(publish_every)
        self.inbox: queue.Queue = queue.Queue()
        self.stored_ids: set[tuple[int, int]] = set()
        self.quarantined_ids: set[tuple[int, int]] = set()
        self.quarantined_transitions = 0
        self.unacked: deque[tuple[int, int, int]] = deque()  # (runner, seq, updates required)
        self.runners: list = []
        self.publisher = WeightPublisher(agent.actor.state_dict, agent.device)
        self._handed: dict[int, int] = {}  # runner → newest weight version handed to it (ack or push)
        # Per worker incarnation, so the driver can account for what a worker did before it died:
        # transitions settled (stored or quarantined) per (runner, incarnation), delivered per (labeler, incarnation).
        self.settled_by_runner: dict[tuple[int, int], int] = defaultdict(int)
        self.delivered_by_labeler: dict[tuple[int, int], int] = defaultdict(int)
        self.duplicate_transitions = 0
        self._stop = threading.Event()
        self.stored = self.duplicates = self.updates = self.version = 0
        self.clock = StageClock(*STAGES)  # stats() reads it while the loop adds to it
        self.last_progress_at = time.time()
        self._quiet = False  # the last wait for data found none
        self._looping = False  # run() is in its loop: requests go to it; otherwise callers serve them
        self._requests: list[LoopRequest] = []
        self._requests_lock = threading.Lock()
        self._last_metrics: dict[str, torch.Tensor] = {}
        self._staleness: list[int] = []
        # Since the last stats(): sums of the labeled reward the learner trains on, of the env's own reward of the
        # same transitions and of their absolute difference, and the count (how a learned reward tracks the env's).
        self._reward_sums = np.zeros(4)

    # -- the algorithm's part ------------------------------------------------------------------------
    def _take(self, meta: ChunkMeta, chunk: Chunk) -> int | None:
        """Keep a new chunk's data; return the update count after which its credit goes back, or None when the
        subclass acks it itself (appending to `unacked` once it is used)."""
        raise NotImplementedError

    def _updates_owed(self) -> int:
        raise NotImplementedError

    def _update(self, n: int) -> None:
        raise NotImplementedError

    def _agent_snapshot(self, with_buffer: bool) -> dict:
        """What a checkpoint holds beyond the shared counters (copies: later updates must not change them)."""
        return {"agent": cpu_copy(self.agent.state_dict())}

    def _agent_restore(self, state: dict) -> None:
        self.agent.load_state_dict(state["agent"])

    def _algo_stats(self) -> dict:
        return {}

    def _burst(self, owed: int) -> int:
        """Updates to run now."""
        return min(owed, self.max_burst) if owed > 0 else 0

    def _plan(self, owed: int) -> tuple[int, bool]:
        """(updates to run now, whether the loop is done: stopped with nothing owed and nothing arriving)."""
        return self._burst(owed), self._stop.is_set() and owed <= 0 and self.inbox.empty()

    @property
    def max_burst(self) -> int:
        """Updates between two looks at the inbox and the requests."""
        return UPDATES_PER_BURST

    # -- wiring ---------------------------------------------------------------------------------------
    def set_runners(self, runners: list) -> None:
        self.runners = list(runners)
        self._publish_now()  # version 1 = the initial weights, so runners and learner start identical

    # -- called by labelers ------------------------------------------------------------------------
    def store(self, labeled: list[tuple[ChunkMeta, Chunk]]) -> None:
        self.inbox.put(labeled)

    def quarantined(self, metas: list[ChunkMeta]) -> None:
        """Chunks a labeler could not label: never stored, but their credits go back to the runners."""
        self.inbox.put([(meta, None) for meta in metas])

    # -- the update loop -----------------------------------------------------------------------------
    def run(self) -> dict:
        with self._requests_lock:
            self._looping = True
        try:
            while True:
                self.clock.timed("checkpoint", self._serve_requests)
                stored = self.store_arrived()
                burst, finished = self._plan(self._updates_owed())
                if burst:
                    self.update_burst(burst)
                self.clock.timed("publish", self._ack_paid)
                if burst or stored:
                    self.last_progress_at = time.time()
                if not burst:
                    if finished:
                        break
                    self._wait_for_data()
        finally:
            with self._requests_lock:
                self._looping = False
                left, self._requests = self._requests, []
            for request in left:  # queued while the loop was ending: nothing runs concurrently any more
                request.serve()
        self.publisher.close()
        return {"updates": self.updates, "stored": self.stored}

    def stop(self) -> None:
        """Finish the owed updates on what is stored, then return from run()."""
        self._stop.set()

    def store_arrived(self) -> bool:
        """Store every chunk that arrived since the last look (timed as "store"): the loop's step between bursts,
        and what `rlfarm bench learner` repeats beside the bursts; whether anything was stored."""
        return self.clock.timed("store", self._drain_inbox)

    def update_burst(self, n: int) -> None:
        """n updates, then the weights published if due: the loop's work per burst (and what
        `rlfarm bench learner` times as the role's speed)."""
        before = self.updates
        self.clock.timed("update", self._update, n)
        self.clock.timed("publish", self._publish_if_due, before)

    def _wait_for_data(self) -> None:
        labeled = self.clock.timed("idle", self._next_in_inbox)
        if labeled is None:
            self._quiet = True
        elif labeled:  # an empty list only wakes the loop (a request is waiting)
            self.clock.timed("store", self._store, labeled)
            self.last_progress_at = time.time()

    def _next_in_inbox(self) -> list | None:
        try:
            return self.inbox.get(timeout=IDLE_WAIT_S)
        except queue.Empty:
            return None

    def _drain_inbox(self) -> bool:
        stored = False
        while True:
            try:
                labeled = self.inbox.get_nowait()
            except queue.Empty:
                return stored
            if labeled:
                self._store(labeled)
                stored = True

    def _store(self, labeled: list[tuple[ChunkMeta, Chunk | None]]) -> None:
        self._quiet = False
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
            size = meta["size"]
            self.stored += size
            self._staleness.append(self.version - meta["policy_version"])
            if "env_reward" in chunk:
                reward, env_reward = chunk["reward"], chunk["env_reward"]
                self._reward_sums += (reward.sum(), env_reward.sum(), np.abs(reward - env_reward).sum(), size)
            required = self._take(meta, chunk)
            if required is not None:
                self.unacked.append((*chunk_id, required))

    def _publish_if_due(self, before: int) -> None:
        """At most one publication per burst: the weights at its end, once `publish_every` updates have passed."""
        if self.updates // self.publish_every > before // self.publish_every:
            self.version += 1
            self.publisher.offer(self.version)

    def _ack_paid(self) -> None:
        paid: dict[int, list[int]] = defaultdict(list)
        while self.unacked and self.unacked[0][2] <= self.updates:
            runner, seq, _ = self.unacked.popleft()
            paid[runner].append(seq)
        published = self.publisher.published
        for runner, seqs in paid.items():
            # The ack carries the newest weights this runner has not been handed yet (interface 1): weights
            # travel with the acks, one call per runner per burst, not a fan-out to every runner per publication.
            newer = published is not None and published[1] > self._handed.get(runner, 0)
            if newer:
                self._handed[runner] = published[1]
            self.runners[runner].ack.remote(seqs, published if newer else None)

    def _publish_now(self) -> None:
        """Publish the current weights as the next version, here and now, and send them to every runner."""
        self.version += 1
        self.publisher.publish_now(self.version)
        self.push_weights()

    def push_weights(self) -> None:
        """Send the newest published weights to every runner (again): a restarted runner starts with none."""
        published = self.publisher.published
        for index, runner in enumerate(self.runners):
            self._handed[index] = published[1]
            runner.receive_weights.remote(published)

    def publish(self) -> Publication:
        """The newest publication (the runners get it with their acks and from `push_weights`)."""
        return self.publisher.published

    # -- reporting / persistence ---------------------------------------------------------------------
    def stats(self) -> dict:
        metrics = {k: float(v) for k, v in self._last_metrics.items()}
        stage_s = self.clock.snapshot()  # the stage in progress counted up to now: a long burst shows as updating
        staleness, self._staleness = self._staleness, []
        (labeled, env, gap, count), self._reward_sums = self._reward_sums, np.zeros(4)
        rewards = {"labeled_reward_mean": labeled / count, "env_reward_mean": env / count,
                   "reward_gap_mean": gap / count} if count else {}
        return {"pid": os.getpid(), "stored": self.stored, "updates": self.updates, "duplicates": self.duplicates,
                "duplicate_transitions": self.duplicate_transitions,
                "settled_by_runner": dict(self.settled_by_runner),
                "delivered_by_labeler": dict(self.delivered_by_labeler),
                "quarantined": self.quarantined_transitions, "policy_version": self.version,
                "update_time_s": stage_s["update"], "stage_s": stage_s,
                "last_progress_at": self.last_progress_at, "owed": max(self._updates_owed(), 0),
                "policy_staleness": float(np.mean(staleness)) if staleness else 0.0, "device": str(self.device),
                **rewards, **metrics, **self._algo_stats()}

    def save(self, path: str, extra: dict | None = None, *rank_parts: dict, with_buffer: bool = True) -> str:
        """Atomic checkpoint (write a temp file, then rename): the agent, counters, stored chunk ids, RNG states,
        the algorithm's data (a replay buffer, optional) and the driver's `extra` state; `rank_parts`: the other
        data-parallel ranks' counters (`ActorLearner.save_part`), handed over by the driver's learner group.

        The snapshot (copies in memory) is taken by the update loop at its next burst boundary, so it is one
        consistent moment; the file is written here, off the loop. A loop stuck inside one burst for longer than
        SAVE_SNAPSHOT_WAIT_S (e.g. compiling) does not hold the checkpoint back: the snapshot is then taken from
        this thread, mid-update, and says so (state["mid_update"])."""
        state = self._at_burst_boundary(lambda: self._snapshot(with_buffer), SAVE_SNAPSHOT_WAIT_S,
                                        late=lambda: {**self._snapshot(with_buffer), "mid_update": True})
        if rank_parts:
            state["ranks"] = list(rank_parts)
        state["extra"] = dict(extra or {})
        return save_atomic(state, path)

    def _snapshot(self, with_buffer: bool) -> dict:
        return {**self._agent_snapshot(with_buffer), **self._counters(), "torch_rng": torch.get_rng_state()}

    def _counters(self) -> dict:
        """The shared counters a checkpoint holds (and the ids of the chunks stored)."""
        return {"stored": self.stored, "updates": self.updates, "version": self.version, "duplicates": self.duplicates,
                "quarantined": self.quarantined_transitions, "stored_ids": [list(i) for i in sorted(self.stored_ids)]}

    def load(self, path: str) -> dict:
        """Restore a checkpoint written by `save` (weights_only: no code runs from the file). Returns `extra`.
        The file is read here; the state is restored by the update loop between two bursts."""
        state = torch.load(path, map_location=self.device, weights_only=True)
        self._at_burst_boundary(lambda: self._restore(state))
        return state["extra"]

    def _restore(self, state: dict, counters: dict | None = None) -> None:
        """The agent from `state`; the counters from `counters` (default: the state's own)."""
        counters = state if counters is None else counters
        self._agent_restore(state)
        self.stored, self.updates, self.version = int(counters["stored"]), int(state["updates"]), int(state["version"])
        self.duplicates, self.quarantined_transitions = int(counters["duplicates"]), int(counters["quarantined"])
        self.stored_ids = {tuple(i) for i in counters["stored_ids"]}
        torch.set_rng_state(state["torch_rng"].cpu())
        self._publish_now()  # runners act with the restored policy from their first chunk

    def _at_burst_boundary(self, work: Callable, wait_s: float | None = None, late: Callable | None = None):
        """work() run by the update loop between two bursts (by this thread when the loop is not running);
        with `late`, late() is run here instead if the loop has not started `work` within `wait_s`."""
        request = LoopRequest(work)
        with self._requests_lock:
            if not self._looping:  # nothing else touches the state: serve it here (run() waits for the lock)
                request.serve()
                return request.result()
            self._requests.append(request)
        self.inbox.put([])  # wakes a loop that is waiting for data
        if not request.wait(wait_s) and late is not None and request.withdraw():
            log.warning("the %s's update loop has been inside one burst for over %.0f s: "
                        "checkpointing mid-update", type(self).__name__, wait_s)
            return late()
        request.wait(None)
        return request.result()

    def _serve_requests(self) -> None:
        with self._requests_lock:
            requests, self._requests = self._requests, []
        for request in requests:
            request.serve()


def cpu_copy(tree):
    """Every tensor in nested dicts/lists copied to CPU memory (a snapshot that later updates do not change)."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().to("cpu", copy=True)
    if isinstance(tree, dict):
        return {key: cpu_copy(value) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(cpu_copy(value) for value in tree)
    return tree

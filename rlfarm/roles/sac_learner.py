"""SAC learner role: the algorithm, its replay buffer (in this process, so sampling is a local gather) and the
update schedule (on CUDA the updates run in CUDA-graph groups: `rlfarm.algos.sac_graph.ReplayUpdates`, held
here, not by the agent). Updates follow the update-to-data ratio (any ratio, below 1 too) and never run ahead of
stored data; a chunk's credit goes back once the updates it owes are done. Storage, acks, weight publication and
checkpoints are the farm learners' shared machinery (rlfarm/roles/chunk_learner.py)."""
from __future__ import annotations

import math
from fractions import Fraction

import torch
from hydra.utils import instantiate

from rlfarm.algos.sac_graph import ReplayUpdates
from rlfarm.buffers.replay import ReplayBuffer
from rlfarm.buffers.sampler import UniformSampler
from rlfarm.buffers.storage import TensorStorage
from rlfarm.roles.base import role
from rlfarm.roles.chunk_learner import UPDATES_PER_BURST, ChunkLearner, cpu_copy
from rlfarm.roles.common import assigned_device, limit_threads, seed_everything

GRAPHED_BURST = 32     # with CUDA graphs (8 updates per replay) a burst of 8 is short: look less often


@role("learner")
class SACLearner(ChunkLearner):
    def __init__(self, algo_cfg: dict, model_cfg: dict, spaces: dict, seed: int, threads: int = 1,
                 device: str | None = None):
        """`device`: where to learn; by default the GPU Ray assigned, else CPU (a bench may name one)."""
        limit_threads(threads)
        seed_everything(seed)
        self.device = device or assigned_device()
        # Exact ratio (0.1 is 1/10, not 0.1000000000000000055): update counts are floor(utd × stored) exactly.
        self.utd_ratio = Fraction(str(float(algo_cfg["utd_ratio"])))
        self.learning_starts = int(algo_cfg["learning_starts"])
        # graph_updates and compile configure this role's update path, not the agent: they sit in the agent's
        # config node so that one override names them (algo.agent.graph_updates)
        agent_cfg = dict(algo_cfg["agent"])
        graph_updates, compile = int(agent_cfg.pop("graph_updates", 0)), bool(agent_cfg.pop("compile", False))
        agent = instantiate(agent_cfg)(
            spaces["obs_dim"], spaces["act_dim"], spaces["action_low"], spaces["action_high"],
            actor=instantiate(model_cfg["actor"]), critic=instantiate(model_cfg["critic"]), device=self.device)
        super().__init__(agent, int(algo_cfg["publish_every"]))
        # float32 storage: chunks arrive as the envs make them (float64 observations, bool flags) and are
        # converted in the one copy that stores them.
        self.buffer = ReplayBuffer(TensorStorage(int(algo_cfg["buffer_size"]), self.device, torch.float32),
                                   UniformSampler(int(algo_cfg["batch_size"]), generator_seed=seed))
        # On CUDA the eager update is launch-bound; captured in CUDA graphs (graph_updates per replay) it runs many
        # times faster (docs/benchmarks.md). On CPU the eager path stays: every update samples with the seeded
        # sampler, so CPU runs are reproducible.
        self.graphed = (ReplayUpdates(self.agent, self.buffer, graph_updates, compile)
                        if graph_updates > 0 and self.agent.device.type == "cuda" else None)
        self._burst_done: torch.cuda.Event | None = None  # marks the end of the last graphed burst on the GPU

    # -- storing and updating ------------------------------------------------------------------------
    def _take(self, meta: dict, chunk: dict) -> int:
        size = meta["size"]
        # Views, no copies: the storage converts to float32 as it copies (one pass, one device copy).
        self.buffer.extend({"obs": chunk["obs"].reshape(size, -1), "action": chunk["action"].reshape(size, -1),
                            "reward": chunk["reward"], "next_obs": chunk["next_obs"].reshape(size, -1),
                            "terminated": chunk["terminated"]})
        return self._required_updates(self.stored)

    def _required_updates(self, stored: int) -> int:
        if stored < self.learning_starts:
            return 0
        return math.floor(self.utd_ratio * (stored - self.learning_starts + 1))

    def _updates_owed(self) -> int:
        return self._required_updates(self.stored) - self.updates

    def _burst(self, owed: int) -> int:
        """Graphed, updates go in whole CUDA-graph groups: a partial group (a low update-to-data ratio owes a few
        updates per chunk) would run eagerly, many times slower, so it waits for the next chunk to complete the
        group, unless no data came in the last wait (or the run is stopping)."""
        if owed <= 0:
            return 0
        if not self.graphed:
            return min(owed, self.max_burst)
        whole = owed - owed % self.graphed.graph_updates
        if whole:
            return min(whole, self.max_burst)
        return owed if self._quiet or self._stop.is_set() else 0

    @property
    def max_burst(self) -> int:
        """Graphed, whole CUDA-graph groups between two looks at the inbox."""
        if not self.graphed:
            return UPDATES_PER_BURST
        group = self.graphed.graph_updates
        return max(group, GRAPHED_BURST - GRAPHED_BURST % group)

    def _update(self, n: int) -> None:
        if self.graphed:  # K updates per CUDA-graph replay, sampling on the device (rlfarm/algos/sac_graph.py)
            # At most one burst queued ahead of the GPU: a launch into a full queue blocks holding the GIL, and
            # then this process cannot answer stats or take in chunks (seen on a GPU shared with EGL rendering).
            # An event wait releases the GIL.
            if self._burst_done is not None:
                self._burst_done.synchronize()
            self._last_metrics = self.graphed(n)
            self._burst_done = torch.cuda.Event()
            self._burst_done.record()
            self.updates += n
        else:
            for _ in range(n):
                self._last_metrics = self.agent.update(self.buffer.sample())
                self.updates += 1  # counted one by one: a slow burst still shows progress in stats()

    # -- checkpoints and stats -----------------------------------------------------------------------
    def _agent_snapshot(self, with_buffer: bool) -> dict:
        state = {"agent": cpu_copy(self.agent.state_dict())}
        if with_buffer:
            state["buffer"] = self.buffer.state_dict()  # copies of the filled rows
        return state

    def _agent_restore(self, state: dict) -> None:
        self.agent.load_state_dict(state["agent"])
        if self.graphed:  # the optimizers' state tensors are new: a captured graph would update the old ones
            self.graphed.reset()
        if "buffer" in state:
            self.buffer.load_state_dict(state["buffer"])

    def _algo_stats(self) -> dict:
        return {"buffer_size": len(self.buffer)}

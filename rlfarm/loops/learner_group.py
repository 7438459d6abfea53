"""The on-policy learner role as one or more data-parallel `LMLearner` actors.

One rank: a single actor, no process group — the one-learner path. N ranks (one per GPU the role holds):
N actors joined in one torch.distributed group with their models under DDP or FSDP (`algo.data_parallel`,
`rlfarm.data_parallel`). Each update goes to every rank with the whole scored batch (only refs travel; each rank
takes its shard), and rank 0 leads: it alone publishes weights to the engines, writes checkpoints and reports
the metrics (under FSDP the ranks gather whole tensors together first, after each update and in `save`).
Every wait on the ranks has a deadline on their liveness (`rlfarm.loops.deadlines.ask`): a rank that does not
answer stats within `timeout_s` is named; `interrupted` (SIGTERM) ends a wait at once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import ray

from rlfarm.algos.grpo_lm import GRPOConfig
from rlfarm.loops.deadlines import WATCH, Watched, ask
from rlfarm.roles.llm import LMLearner


@dataclass
class LearnerGroup:
    ranks: list[ray.actor.ActorHandle]
    gpu_ids: list[int]  # the GPU Ray gave each rank (-1: none, or one rank only)
    timeout_s: float = 30.0  # run.role_timeout_s: how long a rank may leave stats unanswered
    interrupted: Callable[[], bool] = lambda: False
    watched: dict[str, Watched] = field(default_factory=dict)  # "learner" (rank 0), "learner rank i": the ranks

    def __post_init__(self):
        self.watched = {rank_name(i): Watched(rank) for i, rank in enumerate(self.ranks)}

    def ask(self, calls: list[ray.ObjectRef], what: str, interruptible: bool = True) -> list:
        """Each rank's answer to `what` (one call per rank, in rank order); no deadline on the work, one on each
        rank's stats; SIGTERM ends the wait, unless not `interruptible` (the checkpoint SIGTERM asks for)."""
        return ask([(rank_name(i), call) for i, call in enumerate(calls)], what, self.timeout_s,
                   self.interrupted if interruptible else None, self.watched)

    @property
    def lead(self) -> ray.actor.ActorHandle:
        """Rank 0: publishes weights, saves, reports."""
        return self.ranks[0]

    def update(self, generated, rewards) -> dict:
        """Every rank updates on its shard of the batch (they meet in DDP's all-reduce); rank 0's metrics.
        generated, rewards: one engine's step (refs or values), or lists of each engine's part (refs)."""
        if isinstance(generated, list):
            calls = [rank.update_gathered.remote(generated, rewards) for rank in self.ranks]
        else:
            calls = [rank.update.remote(generated, rewards) for rank in self.ranks]
        return self.ask(calls, "update")[0]

    def publish(self, ranks: tuple[int, ...] = (0,)) -> dict[int, ray.ObjectRef]:
        """The newest weights to the engines (`LMLearner.publish`), from rank 0 (or, under CUDA IPC, from each
        rank that shares an engine's GPU): rank → ref. Not waited for: over a broadcast the call ends only once
        the engines received, so the caller hands the refs to them first."""
        return {rank: self.ranks[rank].publish.remote() for rank in ranks}

    def save(self, path: str, extra: dict | None = None) -> str:
        """Rank 0 writes the checkpoint; every rank takes the call (under FSDP they gather the shards together)."""
        return self.ask([rank.save.remote(path, extra) for rank in self.ranks], f"save {path}", False)[0]

    def load(self, path: str) -> dict:
        """Every rank restores the checkpoint; returns its `extra` (the driver's counters)."""
        return self.ask([rank.load.remote(path) for rank in self.ranks], f"load {path}")[0]

    def kill(self) -> None:
        for rank in self.ranks:
            ray.kill(rank, no_restart=True)


def rank_name(rank: int) -> str:
    return "learner" if rank == 0 else f"learner rank {rank}"


def start_learner_group(rank_options: list[dict], cfg: GRPOConfig, threads: int = 1, dtype: str = "float32",
                        timeout_s: float = 30.0, start_timeout_s: float = 120.0,
                        interrupted: Callable[[], bool] = lambda: False) -> LearnerGroup:
    """One LMLearner per entry of `rank_options` (Ray options: one GPU each, in the learner's placement
    group); more than one are joined into a data-parallel group before this returns, each step of that within
    `start_timeout_s` (run.restart_timeout_s: it includes building the model)."""
    world_size = len(rank_options)
    ranks = [ray.remote(concurrency_groups=WATCH)(LMLearner).options(**options).remote(cfg, threads, dtype, rank,
                                                                                        world_size)
             for rank, options in enumerate(rank_options)]
    if world_size == 1:
        return LearnerGroup(ranks, [-1], timeout_s, interrupted)
    named = lambda calls: list(zip(map(rank_name, range(world_size)), calls))  # noqa: E731
    address = ask(named([ranks[0].open_data_parallel.remote()]), "open_data_parallel", start_timeout_s, interrupted)[0]
    gpu_ids = ask(named([rank.join_data_parallel.remote(address) for rank in ranks]), "join_data_parallel",
                  start_timeout_s, interrupted)
    if any(gpu >= 0 for gpu in gpu_ids) and len(set(gpu_ids)) < world_size:  # NCCL needs one GPU per rank
        raise RuntimeError(f"data-parallel learner ranks share a GPU (Ray gave them GPUs {gpu_ids})")
    return LearnerGroup(ranks, gpu_ids, timeout_s, interrupted)

"""A learner role as one or more data-parallel ranks, held by the driver: the one group of every family whose
learner may have ranks (IMPALA/APPO's `ActorLearner` in the off-policy loop, `LMLearner` in the LLM loop).

One rank: a single actor, no process group. N ranks (one per GPU the role holds): N actors of the learner class
(`rank`, `world_size`), joined here into one torch.distributed group (`open_data_parallel` on rank 0, then
`join_data_parallel` on all: `rlfarm.data_parallel`), each on a GPU of its own. No rank speaks for another: the
driver calls every rank itself, and rank 0 leads — it alone publishes weights, writes the checkpoint, and its
stats are the ones reported (with the other ranks' counts added, `merge_stats`). Every rank's liveness is watched
(`watched`: "learner", "learner rank 1", ...) and every rank restores a checkpoint (`load_calls`). How the ranks
save depends on the learner: ranks that must take the call together (an LM learner under FSDP gathers its shards
with the others) all take `save`; ranks with state of their own beside the shared weights (an actor-learner's
counters) hand it to rank 0's `save` (`save_part`), which writes it into the one file.

Every wait has a deadline on the ranks' liveness (`rlfarm.loops.deadlines.ask`): a rank that does not answer
stats within `timeout_s` is named; `interrupted` (SIGTERM) ends a wait at once. The off-policy loop waits through
its own seam to Ray instead (`rlfarm.loops.ray_calls`), so it takes the named calls (`*_calls`) and waits itself.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import ray

from rlfarm.loops.deadlines import WATCH, Watched, ask

if TYPE_CHECKING:
    from rlfarm.algos.grpo_lm import GRPOConfig

Calls = list[tuple[str, ray.ObjectRef]]  # (rank name, its call), rank 0 first


@dataclass
class LearnerGroup:
    ranks: list[ray.actor.ActorHandle]
    gpu_ids: list[int] = field(default_factory=lambda: [-1])  # the GPU Ray gave each rank (-1: none, or one rank)
    timeout_s: float = 30.0  # run.role_timeout_s: how long a rank may leave stats unanswered
    interrupted: Callable[[], bool] = lambda: False
    learner_class: type | None = None  # what the ranks run: how their stats merge and how they save
    watched: dict[str, Watched] = field(default_factory=dict)  # "learner" (rank 0), "learner rank i": the ranks

    def __post_init__(self):
        self.watched = {rank_name(i): Watched(rank) for i, rank in enumerate(self.ranks)}

    @property
    def lead(self) -> ray.actor.ActorHandle:
        """Rank 0: publishes weights, saves, reports."""
        return self.ranks[0]

    @property
    def others(self) -> list[ray.actor.ActorHandle]:
        """Ranks 1..N-1."""
        return self.ranks[1:]

    def named(self, calls: list[ray.ObjectRef]) -> Calls:
        return [(rank_name(i), call) for i, call in enumerate(calls)]

    def ask(self, calls: Calls, what: str, interruptible: bool = True) -> list:
        """Each named rank's answer to `what`; no deadline on the work, one on each rank's stats; SIGTERM ends the
        wait, unless not `interruptible` (the checkpoint SIGTERM asks for)."""
        return ask(calls, what, self.timeout_s, self.interrupted if interruptible else None, self.watched)

    # -- every rank ------------------------------------------------------------------------------------
    def join(self, timeout_s: float) -> None:
        """Join N > 1 ranks into one process group (rank 0 serves the rendezvous), each step within `timeout_s`
        (run.restart_timeout_s: the ranks' constructors, which build the model, run first); every rank leaves it
        with rank 0's weights. Raises when Ray gave two ranks one GPU (NCCL needs one per rank)."""
        if len(self.ranks) == 1:
            return
        address = ask(self.named([self.lead.open_data_parallel.remote()]), "open_data_parallel", timeout_s,
                      self.interrupted)[0]
        self.gpu_ids = ask(self.named([rank.join_data_parallel.remote(address) for rank in self.ranks]),
                           "join_data_parallel", timeout_s, self.interrupted)
        if any(gpu >= 0 for gpu in self.gpu_ids) and len(set(self.gpu_ids)) < len(self.ranks):
            raise RuntimeError(f"data-parallel learner ranks share a GPU (Ray gave them GPUs {self.gpu_ids})")

    def merge_stats(self, lead: dict, others: list[dict]) -> dict:
        """The stats the run reports: rank 0's, with the other ranks' counts added where the learner says how
        (`merge_rank_stats`; the ranks of an LM learner hold the same counts: rank 0's alone)."""
        merge = getattr(self.learner_class, "merge_rank_stats", None)
        return merge(lead, others) if merge is not None and others else lead

    def merged(self, answers: list[dict]) -> dict:
        """`merge_stats` of every rank's answer to `stats_calls`, rank 0's first."""
        return self.merge_stats(answers[0], answers[1:])

    def stats_calls(self) -> Calls:
        return self.named([rank.stats.remote() for rank in self.ranks])

    def save_calls(self, path: str, extra: dict | None = None, **options) -> Calls:
        """The calls that write one checkpoint (rank 0's answer is the file): every rank takes `save` (the LM
        learner's ranks gather their shards together), or, for a learner with `save_part`, the other ranks' parts
        (taken at each one's own burst boundary) go into rank 0's call as arguments, so Ray hands them over."""
        if self.others and hasattr(self.learner_class, "save_part"):
            parts = [rank.save_part.remote() for rank in self.others]
            return [(rank_name(0), self.lead.save.remote(path, extra, *parts, **options))]
        return self.named([rank.save.remote(path, extra, **options) for rank in self.ranks])

    def load_calls(self, path: str) -> Calls:
        """Every rank restores the checkpoint (weights, optimizer, its own counters); rank 0's answer is `extra`."""
        return self.named([rank.load.remote(path) for rank in self.ranks])

    def save(self, path: str, extra: dict | None = None) -> str:
        """Rank 0 writes the checkpoint; returns the file."""
        return self.ask(self.save_calls(path, extra), f"save {path}", False)[0]

    def load(self, path: str) -> dict:
        """Every rank restores the checkpoint; returns its `extra` (the driver's counters)."""
        return self.ask(self.load_calls(path), f"load {path}")[0]

    def run(self) -> list[ray.ObjectRef]:
        """Every rank's update loop (a learner fed by the labelers); their refs, rank 0's first."""
        return [rank.run.remote() for rank in self.ranks]

    def stop(self) -> None:
        """A flag every rank reads: finish what is owed, then return from run() (the ranks leave together)."""
        for rank in self.ranks:
            rank.stop.remote()

    def kill(self) -> None:
        for rank in self.ranks:
            ray.kill(rank, no_restart=True)

    # -- the LM learner's cycle -------------------------------------------------------------------------
    def update(self, generated, rewards) -> dict:
        """Every rank updates on its shard of the batch (they meet in DDP's all-reduce); rank 0's metrics.
        generated, rewards: one engine's step (refs or values), or lists of each engine's part (refs)."""
        if isinstance(generated, list):
            calls = [rank.update_gathered.remote(generated, rewards) for rank in self.ranks]
        else:
            calls = [rank.update.remote(generated, rewards) for rank in self.ranks]
        return self.ask(self.named(calls), "update")[0]

    def publish(self, ranks: tuple[int, ...] = (0,)) -> dict[int, ray.ObjectRef]:
        """The newest weights to the engines (`LMLearner.publish`), from rank 0 (or, under CUDA IPC, from each
        rank that shares an engine's GPU): rank → ref. Not waited for: over a broadcast the call ends only once
        the engines received, so the caller hands the refs to them first."""
        return {rank: self.ranks[rank].publish.remote() for rank in ranks}


def rank_name(rank: int) -> str:
    return "learner" if rank == 0 else f"learner rank {rank}"


def start_ranks(learner_class: type, rank_options: list[dict], args: tuple, remote: dict | None = None,
                timeout_s: float = 30.0, interrupted: Callable[[], bool] = lambda: False) -> LearnerGroup:
    """One actor of `learner_class(*args)` per entry of `rank_options` (Ray options: one GPU each, in the learner's
    placement group; `remote`: `ray.remote`'s options, e.g. concurrency groups); more than one are told their
    rank and the world size. Not waited for: the caller starts its other roles meanwhile, then `join`s."""
    world_size = len(rank_options)
    ranks_of = (lambda rank: {}) if world_size == 1 else (lambda rank: {"rank": rank, "world_size": world_size})
    actor_class = ray.remote(**remote)(learner_class) if remote else ray.remote(learner_class)
    ranks = [actor_class.options(**options).remote(*args, **ranks_of(rank))
             for rank, options in enumerate(rank_options)]
    return LearnerGroup(ranks, [-1] * world_size, timeout_s, interrupted, learner_class)


def start_learner_group(rank_options: list[dict], cfg: GRPOConfig, threads: int = 1, dtype: str = "float32",
                        timeout_s: float = 30.0, start_timeout_s: float = 120.0,
                        interrupted: Callable[[], bool] = lambda: False) -> LearnerGroup:
    """The LLM loop's learner: an `LMLearner` per entry of `rank_options`, joined before this returns (each step
    within `start_timeout_s`, run.restart_timeout_s: it includes building the model)."""
    from rlfarm.roles.llm import LMLearner  # not imported with the group: the off-policy loop has no LM learner

    group = start_ranks(LMLearner, rank_options, (cfg, threads, dtype), {"concurrency_groups": WATCH}, timeout_s,
                        interrupted)
    group.join(start_timeout_s)
    return group

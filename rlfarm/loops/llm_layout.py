"""Where the LLM loop's engines sit next to its learner ranks, decided once at start: which engines share a
GPU with a learner rank (they sleep while the ranks update: time-shared), and how weights reach each engine.

`check_rollout_layout` runs in the preflight, before anything starts (bad input: one line, no run directory;
no torch import); `plan_weight_sync` runs once the roles are up, on the GPUs Ray actually gave them."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from omegaconf import DictConfig

from rlfarm.errors import ConfigError
from rlfarm.loops.llm_memory import check_fits
from rlfarm.topology import Plan

Location = tuple[str, int]  # (node id, GPU id or -1): `rlfarm.roles.llm.gpu_location`


def check_rollout_layout(cfg: DictConfig, plan: Plan) -> None:
    """The step splits evenly across the engines, and asynchronous rollouts (algo.max_staleness > 0) have
    engines with GPUs of their own: a time-shared engine sleeps while the learner updates, so nothing overlaps."""
    engines = len(plan.of("engine"))
    prompts = int(cfg.algo.prompts_per_step)
    if prompts % engines:
        raise ConfigError(f"algo.prompts_per_step={prompts} does not split across {engines} engines "
                          f"(topology.roles.engine.count={engines})",
                          "make algo.prompts_per_step a multiple of the engine count")
    staleness = int(cfg.algo.get("max_staleness", 0))
    if staleness > 0 and time_shared_in_plan(plan):
        raise ConfigError(f"algo.max_staleness={staleness} needs engines on GPUs of their own, but topology "
                          f"'{plan.name}' puts an engine on a learner's GPU (it sleeps while the learner trains)",
                          "use a split topology (split_1_1, split_2_2) or algo.max_staleness=0")
    check_fits(cfg, plan)  # each GPU's estimated memory against the driver's card (rlfarm/memory_plan.py)


def time_shared_in_plan(plan: Plan) -> bool:
    """An engine placed in a GPU bundle that a learner rank also holds."""
    learner_bundles = {(p.pool, p.bundle) for p in plan.of("learner") if p.gpus > 0}
    return any(p.gpus > 0 and (p.pool, p.bundle) in learner_bundles for p in plan.of("engine"))


def sharing_rank(engine: Location, learners: Sequence[Location]) -> int | None:
    """The learner rank on the engine's GPU, if any."""
    if engine[1] < 0:
        return None
    return next((rank for rank, where in enumerate(learners) if where == engine), None)


@dataclass(frozen=True)
class WeightSyncPlan:
    transport: str              # rlfarm.sync.transport.TRANSPORTS
    sources: tuple[int, ...]    # per engine: the learner rank it receives from

    def engines_of(self, rank: int) -> list[int]:
        return [engine for engine, source in enumerate(self.sources) if source == rank]

    @property
    def ranks(self) -> tuple[int, ...]:
        """The learner ranks that publish."""
        return tuple(sorted(set(self.sources)))


def plan_weight_sync(choice: str, learners: Sequence[Location], engines: Sequence[Location], on_gpus: bool,
                     sharded: bool = False) -> WeightSyncPlan:
    """`algo.weight_sync` for these locations. on_gpus: every role computes on a GPU. auto: the object store on
    CPU; NCCL broadcast from rank 0 to every engine when none shares a learner's GPU (one group, one send for
    all); CUDA IPC when every engine shares one, each reading from the rank on its GPU (all ranks hold the whole
    weights under DDP; under FSDP only rank 0 does, so only engines on its GPU can); the object store for a mix."""
    from rlfarm.sync.transport import pick_transport  # torch: not needed by the preflight's layout check

    rank0 = tuple(0 for _ in engines)
    if not on_gpus:
        return WeightSyncPlan(pick_transport(choice, on_gpus=False, time_share=False), rank0)
    shared = [sharing_rank(engine, learners) for engine in engines]
    if all(rank is None for rank in shared):
        return WeightSyncPlan(pick_transport(choice, on_gpus, time_share=False), rank0)  # ipc: refused there
    # rank 0 must be among the sources: it reports the staleness, counted from the versions it published
    if all(rank is not None for rank in shared) and 0 in shared and not (sharded and any(shared)):
        transport = pick_transport(choice, on_gpus, time_share=True)
        if transport == "broadcast":
            raise ConfigError("algo.weight_sync=broadcast cannot reach an engine on a learner rank's GPU "
                              "(NCCL needs one GPU per rank)", "use algo.weight_sync=auto")
        return WeightSyncPlan(transport, tuple(shared) if transport == "ipc" else rank0)
    if choice not in ("auto", "object_store"):
        raise ConfigError(f"algo.weight_sync={choice} cannot reach every engine here: some share a learner "
                          "rank's GPU and some do not, none shares rank 0's, or (FSDP) one shares another rank's",
                          "use algo.weight_sync=auto (the object store) or place the engines alike")
    return WeightSyncPlan("object_store", rank0)

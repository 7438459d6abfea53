"""Topology is data: pools of GPUs + roles placed in them → Ray placement groups.

`plan_topology` is pure (no Ray): it packs each role instance into a GPU bundle of its pool
(first fit, so fractional roles share a GPU) and is what `rlfarm plan` prints. A pool of 0 GPUs is a CPU pool: each
role instance in it gets a bundle of its CPUs. A pool may be pinned to the nodes that hold a custom resource
(`pools.<pool>.node: node_b`, from `ray start --resources='{"node_b": 1}'`): each of its bundles then asks for a
sliver of that resource, so the pool's placement group can only land there (two-node CPU tests, a reward node). `check_cluster`
fails fast, with one line, when the cluster holds less than the plan asks (RLlib waits forever
instead). `PlacedTopology` turns the plan into placement groups and per-actor Ray options.
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from rlfarm.errors import TopologyError
from rlfarm.families import Family

ROLE_NAMES = ("learner", "env_runner", "labeler", "engine")  # a topology may list more than its family places
NODE_SHARE = 0.001  # of a pinned pool's node resource, per bundle: `ray start --resources='{"node_b": 1}'` holds 1,000


@dataclass(frozen=True)
class Placement:
    role: str
    index: int
    pool: str | None
    bundle: int | None  # GPU bundle inside the pool; None when the role has no pool
    cpus: float
    gpus: float
    threads: int


@dataclass(frozen=True)
class Plan:
    name: str
    pool_gpus: dict[str, int]
    placements: tuple[Placement, ...]
    bundles: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    pool_nodes: dict[str, str] = field(default_factory=dict)  # pool → the custom resource it is pinned to

    def node_of(self, p: Placement) -> str | None:
        """The node resource `p`'s pool is pinned to (None: anywhere)."""
        return self.pool_nodes.get(p.pool) if p.pool is not None else None

    def of(self, role: str) -> list[Placement]:
        return [p for p in self.placements if p.role == role]

    @property
    def total_gpus(self) -> int:
        return sum(self.pool_gpus.values())

    @property
    def total_cpus(self) -> float:
        return sum(p.cpus for p in self.placements)


def _role_field(role: str, spec: Mapping, key: str, default, kind):
    value = spec.get(key, default)
    try:
        value = kind(value)
    except (TypeError, ValueError):
        raise TopologyError(f"topology.roles.{role}.{key} must be a number, got {value!r}",
                            f"set topology.roles.{role}.{key}=<number>") from None
    if value < 0:
        raise TopologyError(f"topology.roles.{role}.{key} must be >= 0, got {value}",
                            f"set topology.roles.{role}.{key} to a non-negative value")
    return value


def plan_topology(topology: Mapping, family: Family) -> Plan:
    """Pack role instances into per-GPU bundles. Raises TopologyError on an impossible topology.
    Only the roles `family` places are placed (a topology file may serve several families)."""
    name = str(topology.get("name", "custom"))
    pools = topology.get("pools") or {}
    pool_gpus: dict[str, int] = {}
    pool_nodes: dict[str, str] = {}
    for pool, spec in pools.items():
        gpus = spec.get("gpus", 0) if isinstance(spec, Mapping) else spec
        if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0:
            raise TopologyError(f"topology.pools.{pool}.gpus must be a whole number >= 0, got {gpus!r}",
                                f"set topology.pools.{pool}.gpus=<int>")
        pool_gpus[pool] = gpus
        node = spec.get("node") if isinstance(spec, Mapping) else None
        if node is not None:
            if not isinstance(node, str) or not node.strip():
                raise TopologyError(f"topology.pools.{pool}.node must name a custom resource, got {node!r}",
                                    f"set topology.pools.{pool}.node=<resource given to `ray start --resources`>")
            pool_nodes[pool] = node
    roles = topology.get("roles") or {}
    for missing in (r for r in family.roles if r not in roles):
        raise TopologyError(f"topology '{name}' has no role '{missing}'",
                            f"add topology.roles.{missing} with pool/count/cpus/gpus")
    free: dict[str, list[float]] = {pool: [1.0] * n for pool, n in pool_gpus.items()}
    cpus_in_bundle: dict[str, list[float]] = {pool: [0.0] * n for pool, n in pool_gpus.items()}
    gpus_in_bundle: dict[str, list[int]] = {pool: [1] * n for pool, n in pool_gpus.items()}  # 0: merged away
    cpu_bundles: dict[str, list[float]] = {pool: [] for pool, n in pool_gpus.items() if n == 0}  # CPU pools
    placements: list[Placement] = []
    for role, spec in roles.items():
        if role not in ROLE_NAMES:
            raise TopologyError(f"unknown role '{role}' in topology '{name}'", f"roles are {', '.join(ROLE_NAMES)}")
        if not family.places(role):
            continue
        if not isinstance(spec.get("count", 1), (int, float)) or spec.get("count", 1) < 1:
            raise TopologyError(f"topology.roles.{role}.count must be at least 1, got {spec.get('count')!r}",
                                f"set topology.roles.{role}.count=1 or more")
        count = _role_field(role, spec, "count", 1, float)
        # Learner count N > 1 = N data-parallel ranks, one GPU each, where the family's learner has ranks
        # (`Family.learner_ranks`; its config rules may refuse them for one algorithm, as for SAC).
        single = role == "learner" and not family.learner_ranks
        if count != int(count) or (single and count != 1):
            raise TopologyError(f"topology.roles.{role}.count must be a whole number{' equal to 1' if single else ''}, got {count:g}",
                                f"set topology.roles.{role}.count={'1' if single else '<int>'}")
        cpus = _role_field(role, spec, "cpus", 1, float)
        gpus = _role_field(role, spec, "gpus", 0, float)
        threads = int(_role_field(role, spec, "threads", 1, float)) or 1
        pool = spec.get("pool")
        if gpus > 1 and gpus != int(gpus):
            raise TopologyError(f"topology.roles.{role}.gpus={gpus:g}: a share above 1 GPU must be whole",
                                "use a fraction <= 1 or a whole number of GPUs")
        if pool is None:
            if gpus > 0:
                raise TopologyError(f"role '{role}' asks for {gpus:g} GPU but has no pool",
                                    f"set topology.roles.{role}.pool to one of: {', '.join(pool_gpus) or '(define topology.pools first)'}")
            placements += [Placement(role, i, None, None, cpus, 0.0, threads) for i in range(int(count))]
            continue
        if pool not in pool_gpus:
            raise TopologyError(f"role '{role}' names pool '{pool}', which topology '{name}' does not define",
                                f"use one of: {', '.join(pool_gpus) or '(none defined)'}")
        if pool in cpu_bundles and gpus == 0:  # a CPU pool: a bundle of its own per instance
            if cpus == 0 and pool not in pool_nodes:
                raise TopologyError(f"role '{role}' in the CPU pool '{pool}' asks for nothing (cpus=0)",
                                    f"set topology.roles.{role}.cpus above 0")
            for i in range(int(count)):
                cpu_bundles[pool].append(cpus)
                placements.append(Placement(role, i, pool, len(cpu_bundles[pool]) - 1, cpus, 0.0, threads))
            continue
        for i in range(int(count)):
            # data-parallel learner ranks never share a GPU (NCCL needs one per rank)
            taken = {p.bundle for p in placements if p.role == role and p.pool == pool} if role == "learner" else set()
            bundle = _first_fit(free[pool], gpus, gpus_in_bundle[pool], taken)
            if bundle is None:
                asked = sum(p.gpus for p in placements if p.pool == pool) + gpus * (int(count) - i)
                raise TopologyError(f"topology '{name}': roles in pool '{pool}' ask for {asked:g} GPUs but the pool has {pool_gpus[pool]}",
                                    f"lower topology.roles.{role}.count/gpus or raise topology.pools.{pool}.gpus")
            placements.append(Placement(role, i, pool, bundle, cpus, gpus, threads))
            cpus_in_bundle[pool][bundle] += cpus
    # Drop the bundles merged into a multi-GPU one and renumber the placements to match.
    renumber = {pool: {old: new for new, old in enumerate(i for i, g in enumerate(gpus_in_bundle[pool]) if g)}
                for pool in pool_gpus}
    placements = [p if p.pool is None or p.pool in cpu_bundles else replace(p, bundle=renumber[p.pool][p.bundle])
                  for p in placements]
    bundles = {pool: [{"GPU": float(g), **({"CPU": c} if c > 0 else {})}
                      for g, c in zip(gpus_in_bundle[pool], cpus_in_bundle[pool]) if g] for pool in pool_gpus}
    for pool, cpus_each in cpu_bundles.items():
        bundles[pool] = [{"CPU": c} if c > 0 else {} for c in cpus_each]
    for pool, node in pool_nodes.items():
        bundles[pool] = [{**bundle, node: NODE_SHARE} for bundle in bundles[pool]]
    return Plan(name, pool_gpus, tuple(placements), bundles, pool_nodes)


def _first_fit(free: list[float], share: float, gpus_in_bundle: list[int], taken: set[int] = frozenset()
               ) -> int | None:
    """Index of the first GPU bundle with `share` left. A share of k > 1 whole GPUs (a data-parallel learner)
    takes k untouched one-GPU bundles merged into one k-GPU bundle, which holds its k ranks of one GPU each.
    The merged-away bundles are marked 0 in `gpus_in_bundle` (renumbered by the caller). Bundles in `taken`
    are skipped."""
    if share > 1:
        untouched = [i for i, left in enumerate(free) if gpus_in_bundle[i] == 1 and left >= 1.0 - 1e-9]
        if len(untouched) < share:
            return None
        first, *merged = untouched[: int(share)]
        free[first], gpus_in_bundle[first] = 0.0, int(share)
        for i in merged:
            free[i], gpus_in_bundle[i] = 0.0, 0
        return first
    for i, left in enumerate(free):
        if gpus_in_bundle[i] == 1 and left + 1e-9 >= share and i not in taken:
            free[i] = left - share
            return i
    return None


def local_resources(num_cpus: float | None, num_gpus: int | None) -> dict[str, float]:
    """What a private local Ray would hold: declared values win over what this process may use. Inside a
    Slurm job (or taskset/cgroup limits) that is the allocation: CPUs from the affinity mask, GPUs from
    CUDA_VISIBLE_DEVICES — not the whole node, which Ray would otherwise claim."""
    if num_gpus is None:
        num_gpus = _visible_gpu_count()
    if num_cpus is None:
        num_cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return {"CPU": float(num_cpus), "GPU": float(num_gpus)}


def _visible_gpu_count() -> int:
    import shutil

    if shutil.which("nvidia-smi") is None and not os.path.exists("/proc/driver/nvidia"):
        return 0  # no NVIDIA driver: skip importing torch just to learn that
    try:
        import torch
        return torch.cuda.device_count()
    except Exception:  # no torch/CUDA: a CPU machine
        return 0


def missing_nodes(plan: Plan, available: Mapping[str, float]) -> list[tuple[str, str]]:
    """(pool, node resource) for each pinned pool whose node the cluster lacks (none has joined yet)."""
    return [(pool, node) for pool, node in plan.pool_nodes.items()
            if plan.bundles.get(pool) and available.get(node, 0.0) < NODE_SHARE * len(plan.bundles[pool]) - 1e-9]


def check_cluster(plan: Plan, available: Mapping[str, float], waited_s: float | None = None) -> None:
    """One clear line when the cluster cannot hold the plan. waited_s: how long the caller waited for the pinned
    pools' nodes to join (the line says so)."""
    for pool, node in missing_nodes(plan, available)[:1]:
        waited = f" after {waited_s:g} s (run.restart_timeout_s)" if waited_s else ""
        raise TopologyError(f"topology '{plan.name}' pins pool '{pool}' to a node with the resource '{node}', "
                            f"which no node of the cluster has{waited}",
                            f"start that node with `ray start --address=<head> --resources='{{\"{node}\": 1}}'` "
                            "and join the cluster (ray.address=<head>), or pick another topology")
    gpus, cpus = available.get("GPU", 0.0), available.get("CPU", 0.0)
    if plan.total_gpus > gpus:
        raise TopologyError(f"topology '{plan.name}' needs {plan.total_gpus} GPUs but the cluster has {gpus:g}",
                            "pick a smaller topology (topology=local or colocated), join a bigger cluster (ray.address=...), "
                            "or declare GPUs for a dry placement test (ray.num_gpus=N)")
    if plan.total_cpus > cpus + 1e-9:
        raise TopologyError(f"topology '{plan.name}' needs {plan.total_cpus:g} CPUs but the cluster has {cpus:g}",
                            "lower topology.roles.*.count/cpus or declare more (ray.num_cpus=N)")


class PlacedTopology:
    """Placement groups for a plan, created on a running Ray; `options(p)` gives an actor's Ray options."""

    def __init__(self, plan: Plan, ready_timeout_s: float = 30.0):
        import ray
        from ray.util.placement_group import placement_group

        self.plan = plan
        self.groups = {pool: placement_group(bundles, strategy="PACK", name=f"rlfarm-{pool}")
                       for pool, bundles in plan.bundles.items() if bundles}
        if self.groups:
            ready, _ = ray.wait([g.ready() for g in self.groups.values()], num_returns=len(self.groups),
                                timeout=ready_timeout_s)
            if len(ready) < len(self.groups):
                self.remove()
                raise TopologyError(f"placement groups for topology '{plan.name}' were not ready after {ready_timeout_s:g} s "
                                    "(the cluster lacks free GPUs/CPUs)", "free resources or pick a smaller topology")

    def options(self, p: Placement) -> dict:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        opts: dict = {"num_cpus": p.cpus, "num_gpus": p.gpus}
        if p.pool is not None and p.pool in self.groups:
            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                self.groups[p.pool], placement_group_bundle_index=p.bundle)
        return opts

    def remove(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for g in self.groups.values():
            remove_placement_group(g)
        self.groups = {}


def describe(plan: Plan) -> str:
    gpus = sum(plan.pool_gpus.values())
    return f"{plan.name}: {len(plan.placements)} actors, {gpus} GPUs in {len(plan.pool_gpus)} pools, {plan.total_cpus:g} CPUs"


def gpu_share_label(p: Placement) -> str:
    if p.gpus == 0:
        return "-"
    return f"{p.gpus:g}" if p.gpus < 1 else str(math.floor(p.gpus))


# -- where the runners render (EGL) ------------------------------------------------------------------------------
# Runners hold no GPU share but draw their frames through EGL on a GPU of their node, and rendering takes GPU time
# from whatever else runs there. On the learner's GPU that cost the learner three quarters of its speed (12 renderers
# on one H200, docs/benchmarks.md), so where the topology leaves GPUs without a learner the runners render there
# unless `env.render_gpus` says otherwise. Where those GPUs hold the reward model's labelers, rendering there costs the
# farm instead (split_1_1, CLIP under MPS: labelers 0.82x their bare tower, 1.07x with the rendering on the learner's
# GPU): a trade the user makes with `env.render_gpus` when the reward model, not the learner, sets the pace.

def render_layout(requested: list[int] | None, node_gpus: int, learner_gpus: set[int],
                  labeler_gpus: set[int] = frozenset()) -> tuple[list[int] | None, str | None]:
    """(the GPU indices runners render on — runner i on gpus[i % len]; None: all of the node's —, a warning or None).

    requested: `env.render_gpus` (None: not set); node_gpus: GPUs of the learner's node; learner_gpus and
    labeler_gpus: the ids the learner's ranks and the labelers hold there. Unset, the runners render on the node's
    GPUs that hold no learner, if any. Set, it is kept, with a warning when it puts renderers on a learner's GPU
    although a GPU without one exists: what it costs, and what it buys where it spares labelers' GPUs."""
    free = [gpu for gpu in range(node_gpus) if gpu not in learner_gpus]
    if requested is None:
        return (free, None) if learner_gpus and free else (None, None)
    on_learner = sorted(set(requested) & learner_gpus)
    if not (on_learner and free):
        return list(requested), None
    named = lambda gpus: ("GPU " if len(gpus) == 1 else "GPUs ") + ",".join(map(str, gpus))  # noqa: E731
    cost = (f"env.render_gpus={list(requested)} puts EGL renderers on the learner's {named(on_learner)}, which "
            f"slows its updates")
    spared = sorted((set(free) & set(labeler_gpus)) - set(requested))  # labelers' GPUs it leaves without renderers
    if spared:
        return list(requested), (f"{cost}, and keeps them off the labelers' {named(spared)}: worth it where the reward "
                                 f"model sets the pace, not the learner (docs/benchmarks.md, where runners render); "
                                 f"unset, runners render on {named(free)}")
    return list(requested), f"{cost} (docs/benchmarks.md); leave env.render_gpus unset to render on {named(free)}"


def render_gpus_beside(requested: list[int] | None, learner_gpus: set[int], labeler_gpus: set[int] = frozenset()
                       ) -> tuple[list[int] | None, str | None]:
    """`render_layout` on a running Ray, whose one GPU node holds the learner. A cluster with several GPU nodes
    keeps `requested` as it is: runners have no pool and may land on another node, with its own GPU indices."""
    import ray

    gpu_nodes = [node for node in ray.nodes() if node.get("Alive") and node["Resources"].get("GPU", 0) > 0]
    if len(gpu_nodes) != 1:
        return requested, None
    return render_layout(requested, int(gpu_nodes[0]["Resources"]["GPU"]), learner_gpus, labeler_gpus)


class _GpuIds:
    def ids(self) -> list[int]:
        import ray

        return [int(gpu) for gpu in ray.get_gpu_ids()]


def role_gpu_ids(placed: PlacedTopology, timeout_s: float, role: str = "learner") -> set[int]:
    """The GPU ids Ray gives `role`'s bundles, read by a probe placed as each of its actors will be (and gone before
    it starts: a placement group's bundle keeps its GPUs, so the actor gets the same ids). Call before the role
    starts: its bundles must be free."""
    import ray

    places = [p for p in placed.plan.of(role) if p.gpus > 0]
    if not places:
        return set()
    probes = [ray.remote(_GpuIds).options(**placed.options(p)).remote() for p in places]
    try:
        refs = [probe.ids.remote() for probe in probes]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if len(ready) < len(refs):
            raise TopologyError(f"a probe in the {role}'s placement did not start within {timeout_s:g} s",
                                "free the cluster's resources or raise run.restart_timeout_s")
        return {gpu for ids in ray.get(refs) for gpu in ids}
    finally:
        for probe in probes:
            ray.kill(probe)


def render_gpus_for_runners(requested: list[int] | None, placed: PlacedTopology, timeout_s: float) -> list[int] | None:
    """`env.render_gpus` for the runners of a run on `placed` (`render_layout`), its warning logged once."""
    import logging

    learners = role_gpu_ids(placed, timeout_s)
    # the labelers' GPUs matter only to the warning: probed only where one may follow (the labelers start later)
    warned = requested is not None and bool(set(requested) & learners)
    labelers = role_gpu_ids(placed, timeout_s, "labeler") if warned else set()
    gpus, warning = render_gpus_beside(requested, learners, labelers)
    if warning:
        logging.getLogger("rlfarm").warning(warning)
    return gpus

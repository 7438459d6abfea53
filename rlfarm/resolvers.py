"""OmegaConf resolvers that rlfarm's configs use; registered on import (imported by rlfarm/cli.py).

`conf/hydra/launcher/slurm.yaml` asks Slurm for what the chosen topology needs, so that a sweep sent
with `hydra/launcher=slurm` never asks for less than the run will place (it would then fail its
cluster check on the node) nor for GPUs it leaves idle:

    cpus_per_task: ${rlfarm.slurm_cpus:${topology},${ray.num_cpus},${algo.family}}
    gpus_per_node: ${rlfarm.slurm_gpus:${topology},${algo.family}}

Both read the topology through `plan_topology`, the same arithmetic the run's own cluster check uses, so
the numbers cannot drift from the yaml (a key like `topology.gpus_total` would have to be kept in sync in
every topology file by hand). They see the topology of the sweep's base config: the launcher is built
once per sweep, so a sweep over `topology=` sends every job with the base choice's resources.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

from omegaconf import OmegaConf

from rlfarm.families import named
from rlfarm.topology import plan_topology


def slurm_cpus(topology: Mapping, declared: float | None, family: str) -> int:
    """CPUs per task: the CPUs of the roles the family (`algo.family`) places, rounded up, or `ray.num_cpus`
    when that declares more."""
    needed = math.ceil(plan_topology(topology, named(family)).total_cpus - 1e-9)
    if declared is not None:
        needed = max(needed, math.ceil(float(declared)))
    return max(needed, 1)


def slurm_gpus(topology: Mapping, family: str) -> int | None:
    """GPUs per node: the sum of the topology's pools; None (no --gpus flag at all) when it has none,
    so a CPU-only topology also runs on clusters that define no GPU GRES."""
    gpus = plan_topology(topology, named(family)).total_gpus
    return gpus or None


RESOLVERS = {"rlfarm.slurm_cpus": slurm_cpus, "rlfarm.slurm_gpus": slurm_gpus}


def register() -> None:
    for name, function in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, function)


register()

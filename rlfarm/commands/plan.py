"""`rlfarm plan`: place the topology's roles on the cluster and print role → pool → node → GPU ids.

Probe actors are started exactly where the real roles would be, and report the node and the GPU ids Ray gave
them; no model is loaded. A node is shown as its id's first 8 characters and its custom resources (what a pool is
pinned to: `node_b` on topology=two_node_cpu). Exits 2 with one line when the cluster is too small. It writes nothing: no run
directory, no log file; and it checks only what placement reads (keys and the topology), not the classes a run
would build (importing them, torch among them, is most of a run's start-up)."""
from __future__ import annotations

import logging

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from rlfarm.cli import fail
from rlfarm.cluster import node_labels, ray_session
from rlfarm.commands.common import check_local_cluster, compose_checked_with
from rlfarm.config import check_known_keys
from rlfarm.errors import RlfarmError
from rlfarm.families import family_of
from rlfarm.topology import PlacedTopology, describe, gpu_share_label, plan_topology, render_gpus_beside


NOTHING_WRITTEN = ["hydra.run.dir=.", "hydra.output_subdir=null", "hydra/job_logging=stdout"]


def rewrite_args(args: list[str]) -> list[str]:
    """Hydra's run directory is the current one, and nothing is written in it (no .hydra/, no log file)."""
    return [*args, *NOTHING_WRITTEN]


def preflight(config_name: str, args: list[str]) -> None:
    cfg = compose_checked_with(config_name, args, check_known_keys)
    family_of(cfg).check_plan(cfg, plan_topology(cfg.topology, family_of(cfg)))
    check_local_cluster(cfg, args)


class Probe:
    def where(self) -> dict:
        import os

        import ray

        return {"gpu_ids": [str(g) for g in ray.get_gpu_ids()], "node": ray.get_runtime_context().get_node_id(),
                "pid": os.getpid()}


def placements_with_gpu_ids(plan, placed: PlacedTopology) -> list[dict]:
    import ray

    probes = [ray.remote(Probe).options(**placed.options(p)).remote() for p in plan.placements]
    where = ray.get([probe.where.remote() for probe in probes])
    for probe in probes:
        ray.kill(probe)
    labels = node_labels()
    where = [{**w, "node_label": labels.get(w["node"], w["node"][:8])} for w in where]
    return [{"role": p.role, "index": p.index, "pool": p.pool, "gpus": p.gpus, "cpus": p.cpus, **w}
            for p, w in zip(plan.placements, where)]


def task(cfg: DictConfig) -> list[dict]:
    try:
        plan = plan_topology(cfg.topology, family_of(cfg))
        with ray_session(cfg.ray, plan):
            placed = PlacedTopology(plan, float(cfg.ray.ready_timeout_s))
            rows = placements_with_gpu_ids(plan, placed)
            placed.remove()
            renders_on = render_column(OmegaConf.select(cfg, "env.render_gpus"), rows)
    except RlfarmError as error:
        fail(error)
    table = Table(title=describe(plan), title_justify="left")
    for column in ("role", "pool", "GPU share", "CPUs", "GPU ids", "renders on", "node"):
        table.add_column(column)
    for row, p, render in zip(rows, plan.placements, renders_on):
        table.add_row(f"{row['role']}[{row['index']}]", row["pool"] or "-", gpu_share_label(p), f"{row['cpus']:g}",
                      ",".join(row["gpu_ids"]) or "-", render, row["node_label"])
    Console().print(table)
    return rows


def render_column(requested: list[int] | None, rows: list[dict]) -> list[str]:
    """Per row, the GPU a runner draws its frames on through EGL when the reward needs frames (as a run chooses it,
    rlfarm.topology.render_layout); "-" for other roles. Logs the run's warning when renderers share a learner's GPU."""
    import ray

    learners = {int(gpu) for row in rows if row["role"] == "learner" for gpu in row["gpu_ids"]}
    gpus, warning = render_gpus_beside(list(requested) if requested is not None else None, learners)
    if warning:
        logging.getLogger("rlfarm").warning(warning)
    node_gpus = int(ray.cluster_resources().get("GPU", 0))
    spread = gpus or list(range(node_gpus))
    return [("GPU " + str(spread[row["index"] % len(spread)]) if spread else "CPU (software GL)")
            if row["role"] == "env_runner" else "-" for row in rows]

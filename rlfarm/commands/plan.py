"""`rlfarm plan`: place the topology's roles on the cluster and print role → pool → node → GPU ids.

Probe actors are started exactly where the real roles would be, and report the node and the GPU ids Ray gave
them; no model is loaded. A node is shown as its id's first 8 characters and its custom resources (what a pool is
pinned to: `node_b` on topology=two_node_cpu). Exits 2 with one line when the cluster is too small. It writes nothing: no run
directory, no log file; and it checks only what placement reads (keys and the topology), not the classes a run
would build (importing them, torch among them, is most of a run's start-up).

When the roles sit on more than one node, lines under the table name how each pair of roles that hand each other
weights or data will do it: through one node's shared-memory object store, across the nodes' object stores
(raylet to raylet), or over NCCL (CUDA IPC on one GPU) for an LLM learner's weights to engines that hold GPUs
(as `algo.weight_sync=auto` picks: rlfarm/loops/llm_layout.py)."""
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


def where_am_i() -> dict:
    """What a role placed here would see: its GPU ids and node."""
    import ray

    return {"gpu_ids": [str(g) for g in ray.get_gpu_ids()], "node": ray.get_runtime_context().get_node_id()}


def placements_with_gpu_ids(plan, placed: PlacedTopology) -> list[dict]:
    """One probe task per placement, with the placement's resources and bundle, asked one after another: a
    bundle's GPU ids are fixed when its group is placed, so a task sees the ids the role's actor would, and tasks
    run one at a time reuse one worker process (an actor each would start a process each: ~15 for split_1_3)."""
    import ray

    probe = ray.remote(where_am_i)
    where = [ray.get(probe.options(**placed.options(p)).remote()) for p in plan.placements]
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
    console = Console()
    console.print(table)
    for line in [*transport_lines(rows, OmegaConf.select(cfg, "algo.weight_sync")),
                 *family_of(cfg).memory_lines(cfg, plan)]:
        console.print(line, highlight=False, soft_wrap=True)
    return rows


# Who hands what to whom, by role kind (docs/architecture.md §3): (sender, receiver, weights or data, unless this
# kind is placed too). A pair is shown where both kinds are placed. Runners' data goes to the learner through the
# labelers where there are any (the off-policy farm); an engine's rollouts go to the learner where no runner plays
# (LLM: the VLA's server answers the runners, whose rollouts go to the learner).
FLOWS = (("learner", "env_runner", "weights", None), ("learner", "engine", "weights", None),
         ("env_runner", "engine", "data", None), ("env_runner", "labeler", "data", None),
         ("engine", "labeler", "data", None), ("labeler", "learner", "data", None),
         ("engine", "learner", "data", "env_runner"), ("env_runner", "learner", "data", "labeler"))
SYNC_NAMES = {"broadcast": "NCCL broadcast", "ipc": "CUDA IPC"}


def transport_lines(rows: list[dict], weight_sync: str | None) -> list[str]:
    """Per pair of role kinds that exchange weights or data, the transport(s) between their placed instances;
    nothing when every role is on one node. weight_sync: the LLM learner's `algo.weight_sync` (None: a family
    whose weights always go through the object store)."""
    if len({row["node"] for row in rows}) < 2:
        return []
    kinds = {row["role"] for row in rows}
    lines = [f"transports (roles on {len({row['node'] for row in rows})} nodes):"]
    for sender, receiver, what, unless in FLOWS:
        if {sender, receiver} <= kinds and unless not in kinds:
            pairs = [(a, b) for a in rows if a["role"] == sender for b in rows if b["role"] == receiver]
            used = dict.fromkeys(transport(a, b, weight_sync if what == "weights" else None) for a, b in pairs)
            lines.append(f"  {sender} → {receiver} ({what}): {'; '.join(used)}")
    return lines


def transport(sender: dict, receiver: dict, weight_sync: str | None) -> str:
    """How one placed role's weights or data reach another's (rows of `placements_with_gpu_ids`)."""
    same_node = sender["node"] == receiver["node"]
    if weight_sync is not None and sender["gpu_ids"] and receiver["gpu_ids"]:
        shared_gpu = same_node and set(sender["gpu_ids"]) & set(receiver["gpu_ids"])
        choice = weight_sync if weight_sync != "auto" else ("ipc" if shared_gpu else "broadcast")
        if choice in SYNC_NAMES:
            return SYNC_NAMES[choice]
    if same_node:
        return f"shared memory ({sender['node_label']}'s object store)"
    return f"object store across raylets ({sender['node_label']} → {receiver['node_label']})"


def render_column(requested: list[int] | None, rows: list[dict]) -> list[str]:
    """Per row, the GPU a runner draws its frames on through EGL when the reward needs frames (as a run chooses it,
    rlfarm.topology.render_layout); "-" for other roles. Logs the run's warning when renderers share a learner's GPU."""
    import ray

    learners = {int(gpu) for row in rows if row["role"] == "learner" for gpu in row["gpu_ids"]}
    labelers = {int(gpu) for row in rows if row["role"] == "labeler" for gpu in row["gpu_ids"]}
    gpus, warning = render_gpus_beside(list(requested) if requested is not None else None, learners, labelers)
    if warning:
        logging.getLogger("rlfarm").warning(warning)
    node_gpus = int(ray.cluster_resources().get("GPU", 0))
    spread = gpus or list(range(node_gpus))
    return [("GPU " + str(spread[row["index"] % len(spread)]) if spread else "CPU (software GL)")
            if row["role"] == "env_runner" else "-" for row in rows]

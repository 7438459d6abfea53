"""What the farm benches (labeler, pipeline) share: the real SACLearner as the sink of labeled chunks, placement
through the real topology code, and rates read from the roles' own counters over a steady window.

The roles themselves (Labeler, SACLearner, EnvRunner) are used as they are, as Ray actors started the way
rlfarm/loops/roles.py starts them; what stands in for a stage that is *not* being measured is in
rlfarm/bench/stand_ins.py.
"""
from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import ray
from omegaconf import OmegaConf

from rlfarm.config import CONF_DIR
from rlfarm.families import OFFPOLICY
from rlfarm.roles.sac_learner import SACLearner
from rlfarm.topology import PlacedTopology, Placement, Plan, check_cluster, plan_topology

CONCURRENCY = 8  # threaded actors, as in rlfarm/loops/roles.py: the run loop takes one thread, peers' calls the rest
NEVER = 10**15   # a step count no bench reaches: learning never starts, runners act randomly throughout


# -- placement and Ray ------------------------------------------------------------------------------
def farm_topology(name: str, *, runners: int, labelers: int, labeler_gpus: float, cpus: float) -> dict:
    """A topology for the bench's actors: runners (or producers) and the learner on CPUs, the labelers on a
    `reward` pool of as many GPUs as their shares need (none when labeler_gpus is 0)."""
    reward_gpus = math.ceil(labelers * labeler_gpus - 1e-9) if labeler_gpus > 0 else 0
    return {
        "name": name,
        "pools": {"reward": {"gpus": reward_gpus}} if reward_gpus else {},
        "roles": {
            "learner": {"pool": None, "count": 1, "cpus": cpus},
            "env_runner": {"pool": None, "count": runners, "cpus": cpus},
            "labeler": {"pool": "reward" if reward_gpus else None, "count": labelers, "gpus": labeler_gpus,
                        "cpus": cpus, "threads": 2 if reward_gpus else 1},
        },
    }


@contextmanager
def bench_ray(plan: Plan, device: str) -> Iterator[None]:
    """The Ray the bench runs on: the one already started in this process (tests), else a private local one
    (as `rlfarm train` starts it). On cpu no GPU is declared, so every role runs on CPU even on a GPU machine."""
    if ray.is_initialized():
        check_cluster(plan, ray.cluster_resources())
        yield
        return
    from rlfarm.cluster import ray_session

    num_cpus = max(os.cpu_count() or 1, math.ceil(plan.total_cpus))
    ray_cfg = OmegaConf.create({"address": None, "num_cpus": num_cpus, "num_gpus": None if device == "cuda" else 0,
                                "dashboard": False})
    with ray_session(ray_cfg, plan):
        yield


@dataclass
class Placed:
    """Actors started for one measured phase; `close()` kills them and frees their placement groups."""

    placed: PlacedTopology
    actors: list = field(default_factory=list)

    def start(self, cls, placement: Placement, *args):
        actor = ray.remote(cls).options(**self.placed.options(placement), max_concurrency=CONCURRENCY).remote(*args)
        self.actors.append(actor)
        return actor

    def close(self) -> None:
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.placed.remove()


@contextmanager
def placed(topology: dict) -> Iterator[tuple[Plan, Placed]]:
    plan = plan_topology(topology, OFFPOLICY)
    phase = Placed(PlacedTopology(plan))
    try:
        yield plan, phase
    finally:
        phase.close()


def store_only_learner_args(spaces: dict, seed: int = 0) -> tuple:
    """Arguments of a real SACLearner (SAC, conf/algo/sac.yaml + conf/model/mlp.yaml) that stores, de-duplicates
    and acks every chunk but never updates: learning starts at a step no bench reaches, so the learner is the
    farm's sink and never its bottleneck (its update speed is `rlfarm bench learner`'s subject)."""
    algo = OmegaConf.load(CONF_DIR / "algo" / "sac.yaml")
    algo.learning_starts, algo.buffer_size = NEVER, 100_000
    model = OmegaConf.load(CONF_DIR / "model" / "mlp.yaml")
    return (OmegaConf.to_container(algo, resolve=True), OmegaConf.to_container(model, resolve=True), spaces, seed, 1)


def box_spaces(obs_dim: int, act_dim: int) -> dict:
    return {"obs_dim": obs_dim, "act_dim": act_dim, "action_low": -np.ones(act_dim, np.float32),
            "action_high": np.ones(act_dim, np.float32)}


def start_learner(phase: Placed, plan: Plan, spaces: dict):
    (place,) = plan.of("learner")
    return phase.start(SACLearner, place, *store_only_learner_args(spaces))


def assigned_gpus(actor) -> list[int]:
    """The GPUs Ray gave an actor (physical indices), asked of the actor itself."""
    return [int(g) for g in ray.get(actor.__ray_call__.remote(_ray_gpu_ids))]


def _ray_gpu_ids(actor_self) -> list:
    return list(ray.get_gpu_ids())


# -- measuring --------------------------------------------------------------------------------------
def wait_until(check: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench: {what} did not happen within {timeout_s:g} s")
        time.sleep(poll_s)


@dataclass
class Window:
    """Counters read at the start of a steady window and after each of its slices."""

    times: list[float]
    counters: list[dict[str, float]]

    def rates(self, key: str) -> list[float]:
        return [(b[key] - a[key]) / (tb - ta) for a, b, ta, tb in
                zip(self.counters, self.counters[1:], self.times, self.times[1:])]

    def median_rate(self, key: str) -> float:
        return statistics.median(self.rates(key))

    def mean_rate(self, key: str) -> float:
        return (self.counters[-1][key] - self.counters[0][key]) / (self.times[-1] - self.times[0])


def steady_window(read: Callable[[], dict[str, float]], warmup_s: float, window_s: float, slices: int) -> Window:
    """Wait `warmup_s`, then read the counters at the start and after each of `slices` equal slices of
    `window_s`: the median of the slices' rates is the figure, as the median of repeats is elsewhere."""
    time.sleep(warmup_s)
    times, counters = [time.monotonic()], [read()]
    for _ in range(slices):
        time.sleep(window_s / slices)
        counters.append(read())
        times.append(time.monotonic())
    return Window(times, counters)


def sum_stats(actors: list, key: str) -> float:
    return float(sum(stats[key] for stats in ray.get([a.stats.remote() for a in actors])))

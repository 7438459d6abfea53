"""Start the off-policy roles as Ray actors where the topology placed them, and wire them together."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import ray
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from rlfarm.envs.spaces import env_policy_dims
from rlfarm.families import family_of
from rlfarm.loops.deadlines import RoleUnresponsive
from rlfarm.loops.learner_group import LearnerGroup, start_ranks
from rlfarm.mps import client_options
from rlfarm.roles.env_runner import EnvRunner
from rlfarm.roles.actor_learner import ActorLearner
from rlfarm.roles.labeler import Labeler
from rlfarm.roles.sac_learner import SACLearner
from rlfarm.topology import PlacedTopology, render_gpus_for_runners

log = logging.getLogger("rlfarm")

# Threaded actors: the long-running loop takes one thread, calls from peers (submit, ack, stats) the others.
CONCURRENCY = 8
FLIGHT_PER_BUS = 4  # transitions in flight per transition of the labelers' buses that keeps a frame farm busy
# algo.name → the learner role fed by the farm: SAC's replay, or the actor-learners' V-trace on stale trajectories
LEARNERS = {"sac": SACLearner, "impala": ActorLearner, "appo": ActorLearner}


@dataclass
class OffPolicyRoles:
    learner: ray.actor.ActorHandle  # rank 0 of `learners`: it publishes and writes the checkpoint
    runners: list[ray.actor.ActorHandle]
    labelers: list[ray.actor.ActorHandle]
    learners: LearnerGroup | None = None  # the learner's data-parallel ranks (default: `learner` alone)

    def __post_init__(self):
        if self.learners is None:
            self.learners = LearnerGroup([self.learner])

    @property
    def learner_ranks(self) -> list[ray.actor.ActorHandle]:
        """Where the labelers deliver (runner i's chunks to rank i mod N)."""
        return self.learners.ranks

    @property
    def all(self) -> list[ray.actor.ActorHandle]:
        return [*self.learner_ranks, *self.runners, *self.labelers]

    def kill(self) -> None:
        for actor in self.all:
            ray.kill(actor, no_restart=True)


def reward_inputs(reward_cfg: DictConfig) -> tuple[list[str], int | None, int]:
    """What the runners must record for the reward model: (needs, frame size, frame stack). Constructing it loads
    no weights."""
    model = instantiate(reward_cfg)
    return list(model.needs), model.frame_size, int(getattr(model, "frame_stack", 1))


def warn_if_the_farm_would_starve(cfg: DictConfig, runners: int, labelers: int) -> None:
    """Runners stop at `credits` chunks in flight; a labeler fires a full bus. A chunk stays in flight from the runner
    through a bus, the model and the learner's store until its ack, so the labelers see only part of what is in
    flight: on 4x H200 they were 75 % busy with twice their buses in flight, 99.5 % with four times
    (docs/benchmarks.md). Below four times, say so once, with the fix. Only for labelers on GPUs: on CPU (the
    default local topology) a model call costs about its batch, and a bus that fires on its timeout loses nothing."""
    algo = cfg.algo
    in_flight = runners * int(cfg.env.get("num_envs", 1)) * int(algo.chunk_steps) * int(algo.credits)
    buses = labelers * int(cfg.labeler.bus_items)
    if in_flight < FLIGHT_PER_BUS * buses:
        needed = -(-FLIGHT_PER_BUS * buses * int(algo.credits) // in_flight)
        log.warning("at most %s transitions can be in flight (runners x env.num_envs x algo.chunk_steps x "
                    "algo.credits) against %s in the labelers' buses: the reward model will wait for frames; "
                    "set algo.credits=%d (or lower labeler.bus_items)", f"{in_flight:,}", f"{buses:,}", needed)


def start_offpolicy_roles(cfg: DictConfig, placed: PlacedTopology, quarantine_dir: str | None = None) -> OffPolicyRoles:
    plan, algo = placed.plan, cfg.algo
    # Runners and labelers hold nothing that cannot be rebuilt: Ray restarts them (constructor again) and the
    # loop re-wires them. Their in-flight calls are not retried; the loop re-sends what they held instead.
    restartable = {"max_restarts": int(cfg.run.max_restarts), "max_task_retries": 0}
    as_dict = lambda node: OmegaConf.to_container(node, resolve=True)  # noqa: E731 - plain dicts travel to actors
    needs, frame_size, frame_stack = reward_inputs(cfg.reward)
    if "frames" in needs and any(p.gpus for p in plan.of("labeler")):  # a GPU frame farm; on CPU a bus that fires
        warn_if_the_farm_would_starve(cfg, len(plan.of("env_runner")), len(plan.of("labeler")))  # on time is fine
    kwargs = as_dict(cfg.env.kwargs) if cfg.env.get("kwargs") else {}
    spaces = env_policy_dims(str(cfg.env.id), kwargs)  # before any actor: a bad env fails here, in one line
    learner_class = LEARNERS[str(algo.name)]
    mps_clients = family_of(cfg).mps_clients  # the roles that share their GPUs through the run's MPS daemon
    env_cfg = as_dict(cfg.env)
    if frame_size is not None:  # runners render: off the learner's GPU where the topology leaves one free
        env_cfg["render_gpus"] = render_gpus_for_runners(env_cfg.get("render_gpus"), placed, float(cfg.run.restart_timeout_s))
    learners = start_learner_ranks(learner_class, placed, (as_dict(algo), as_dict(cfg.model), spaces, int(cfg.seed)))
    ranks = learners.ranks
    runner_places = plan.of("env_runner")
    random_steps = -(-int(algo.get("learning_starts", 0)) // len(runner_places))
    behaviour = learner_class is ActorLearner  # V-trace needs log μ(a|s) of every action
    runners = [
        ray.remote(EnvRunner).options(**placed.options(p), max_concurrency=CONCURRENCY, **restartable).remote(
            p.index, env_cfg, as_dict(cfg.model.actor), needs, frame_size, int(cfg.seed),
            int(algo.chunk_steps), int(algo.credits), random_steps, p.threads, frame_stack, behaviour)
        for p in runner_places]
    labelers = [
        ray.remote(Labeler).options(**placed.options(p), max_concurrency=CONCURRENCY, **restartable,
                                    **(client_options() if "labeler" in mps_clients else {})).remote(
            p.index, as_dict(cfg.reward), int(cfg.labeler.bus_items), float(cfg.labeler.bus_timeout_s), p.threads,
            quarantine_dir)
        for p in plan.of("labeler")]
    wired = {**{f"learner rank {i}": rank.set_runners.remote(runners) for i, rank in enumerate(ranks)},
             **{f"env_runner {i}": r.set_labelers.remote(labelers) for i, r in enumerate(runners)},
             **{f"labeler {i}": l.set_learner.remote(ranks) for i, l in enumerate(labelers)}}
    wait_until_started(wired, float(cfg.run.restart_timeout_s))
    learners.join(float(cfg.run.restart_timeout_s))
    return OffPolicyRoles(learners.lead, runners, labelers, learners)


def start_learner_ranks(learner_class: type, placed: PlacedTopology, args: tuple) -> LearnerGroup:
    """The learner (started first: it takes longest to build); with `topology.roles.learner.count` N > 1 (an
    actor-learner, checked at preflight), N data-parallel ranks, one GPU each (rlfarm/roles/actor_learner.py),
    joined once every role has started (`LearnerGroup.join`)."""
    places = placed.plan.of("learner")
    return start_ranks(learner_class, [placed.options(p) | {"max_concurrency": CONCURRENCY} for p in places],
                       (*args, places[0].threads))


def wait_until_started(calls: dict[str, ray.ObjectRef], timeout_s: float) -> None:
    """Each role's first call returns once its constructor has run (model loaded, env made). A constructor that
    raised raises here; one that never returns (a wedged GPU, a stuck download) is named instead of waited for."""
    ready, _ = ray.wait(list(calls.values()), num_returns=len(calls), timeout=timeout_s)
    ray.get(ready)
    late = [name for name, ref in calls.items() if ref not in ready]
    if late:
        named = ", ".join(late[:4]) + (f" and {len(late) - 4} more" if len(late) > 4 else "")
        raise RoleUnresponsive(f"{named} did not finish starting within run.restart_timeout_s={timeout_s:g} s "
                               "(a model load or compile that hangs?); raise run.restart_timeout_s if it needs longer")

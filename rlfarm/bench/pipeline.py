"""`rlfarm bench pipeline` (issue 4, P2): does the whole off-policy pipeline run as fast as its slowest stage?

Two stages of known cost run through the real roles (EnvRunner, Labeler, SACLearner as Ray actors, placed by the
topology code):
- env: EnvRunners stepping FixedCostEnv, whose step spins `step_cpu_ms` of CPU (a CPU-bound simulator);
- reward: Labelers running FixedCostReward, `batch_ms` per bus piece plus `item_us` per transition (a slow
  reward model: a spinning kernel on a GPU, a sleep on CPU).
Each stage is measured alone first, in the same run: the runners against a sink that acks at once; the
labelers fed by producers of ready-made chunks (one per runner, same chunks and credits, but no env steps) and
delivering to the learner. Then the whole
pipeline, runners → labelers → learner, counted as transitions stored by the learner. Rows: both stages
alone, the pipeline against the slower of them (target ≥ 0.9×), and how busy the labelers kept their GPUs
(NVML; target ≥ 80 %) and themselves (share of wall time inside the model call).

The learner stores, de-duplicates and acks but never updates: its speed is `rlfarm bench learner`'s subject,
and here it must not be the slowest stage. Runners act randomly, as they do before learning starts.
"""
from __future__ import annotations

from contextlib import nullcontext

import ray
import torch
from omegaconf import DictConfig, OmegaConf

from rlfarm.bench.common import sizes
from rlfarm.bench.farm import (NEVER, Window, assigned_gpus, bench_ray, box_spaces,
                               farm_topology, placed, start_learner, steady_window, sum_stats, wait_until)
from rlfarm.bench.stand_ins import MODULE_ENV_ID, ChunkProducer, InstantAck
from rlfarm.config import CONF_DIR
from rlfarm.families import OFFPOLICY
from rlfarm.rewards.fixed_cost import FixedCostReward
from rlfarm.roles.env_runner import EnvRunner
from rlfarm.roles.labeler import Labeler
from rlfarm.telemetry.gpu_busy import GpuBusySampler, nvml_available
from rlfarm.topology import plan_topology

OBS_DIM, ACT_DIM = 8, 2
REWARD_STAGE, ENV_STAGE, PIPELINE = "reward stage alone", "env stage alone", "whole pipeline"


def run(cfg: DictConfig, device: str) -> list[dict]:
    size = sizes(cfg, device)
    labelers, labeler_gpus = labeler_count(size, device)
    cpus = float(size.cpus_per_actor)
    runners_topology = farm_topology("bench-pipeline", runners=int(size.runners), labelers=labelers,
                                     labeler_gpus=labeler_gpus, cpus=cpus)
    with bench_ray(plan_topology(runners_topology, OFFPOLICY), device):
        reward = reward_stage(size, runners_topology)
        env = env_stage(size, runners_topology)
        whole = whole_pipeline(size, runners_topology)
    slowest = min((reward, REWARD_STAGE), (env, ENV_STAGE), key=lambda r: r[0]["per_s"])[1]
    model = FixedCostReward(size.batch_ms, size.item_us, size.bus_items)
    rows = [
        {"case": REWARD_STAGE, "value": reward["per_s"], "unit": "transitions/s", "baseline": None,
         "labelers": labelers, "gpus_per_labeler": labeler_gpus,
         "model_limit": labelers * int(size.bus_items) / model.cost_s(int(size.bus_items)),
         **{k: v for k, v in reward.items() if k != "per_s"}},
        {"case": ENV_STAGE, "value": env["per_s"], "unit": "env steps/s", "baseline": None,
         "runners": int(size.runners), "envs_per_runner": int(size.envs_per_runner),
         "cpu_limit": int(size.runners) * 1e3 / float(size.step_cpu_ms),
         **{k: v for k, v in env.items() if k != "per_s"}},
        {"case": PIPELINE, "value": whole["per_s"], "unit": "env steps/s", "baseline": slowest,
         **{k: v for k, v in whole.items() if k != "per_s"}},
        {"case": "labelers busy in the model (pipeline)", "value": 100 * whole["labeler_busy"],
         "unit": "% of wall time", "baseline": None, "target": 80},
    ]
    if "gpu_busy_percent" in whole:
        busy = whole["gpu_busy_percent"]
        rows.append({"case": "labeler GPUs busy (pipeline, NVML)", "value": sum(busy.values()) / len(busy),
                     "unit": "% of wall time", "baseline": None, "target": 80, "per_gpu": busy})
    return rows


def labeler_count(size: DictConfig, device: str) -> tuple[int, float]:
    """(labelers, GPU share of each): `labelers_per_gpu` on each of `gpus` GPUs (null: all visible); on cpu
    `labelers` with no GPU."""
    if device != "cuda":
        return int(size.labelers), 0.0
    visible = torch.cuda.device_count()
    gpus = visible if size.gpus is None else min(int(size.gpus), visible)
    return gpus * int(size.labelers_per_gpu), 1 / int(size.labelers_per_gpu)


def reward_cfg(size: DictConfig) -> dict:
    reward = OmegaConf.load(CONF_DIR / "reward" / "fixed_cost.yaml")
    reward.batch_ms, reward.item_us, reward.max_batch = float(size.batch_ms), float(size.item_us), int(size.bus_items)
    return OmegaConf.to_container(reward, resolve=True)


def env_cfg(size: DictConfig) -> dict:
    return {"id": MODULE_ENV_ID, "num_envs": int(size.envs_per_runner),
            "kwargs": {"step_cpu_ms": float(size.step_cpu_ms), "obs_dim": OBS_DIM, "act_dim": ACT_DIM}}


def chunk_transitions(size: DictConfig) -> int:
    return int(size.chunk_steps) * int(size.envs_per_runner)


def start_labelers(phase, plan, size: DictConfig) -> list:
    return [phase.start(Labeler, p, p.index, reward_cfg(size), int(size.bus_items), float(size.bus_timeout_s), p.threads)
            for p in plan.of("labeler")]


def start_runners(phase, plan, size: DictConfig) -> list:
    actor = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / "mlp.yaml").actor, resolve=True)
    return [phase.start(EnvRunner, p, p.index, env_cfg(size), actor, list(FixedCostReward.needs), None, 0,
                        int(size.chunk_steps), int(size.credits), NEVER, p.threads)
            for p in plan.of("env_runner")]


def window(size: DictConfig, read) -> Window:
    return steady_window(read, float(size.warmup_s), float(size.window_s), int(size.repeats))


def reward_stage(size: DictConfig, topology: dict) -> dict:
    """Producers of ready-made chunks → Labelers → SACLearner, fed as the runners feed them: one producer per runner,
    the same chunk size and credits, so the labelers see the same buses."""
    fields = {"obs": ([OBS_DIM], "float32"), "next_obs": ([OBS_DIM], "float32"), "action": ([ACT_DIM], "float32"),
              "terminated": ([], "bool"), "truncated": ([], "bool"), "env_reward": ([], "float32")}
    with placed(topology) as (plan, phase):
        labelers = start_labelers(phase, plan, size)
        learner = start_learner(phase, plan, box_spaces(OBS_DIM, ACT_DIM))
        producers = [phase.start(ChunkProducer, p, p.index, fields, chunk_transitions(size), int(size.credits))
                     for p in plan.of("env_runner")]
        return run_farm(size, learner, labelers, producers)


def env_stage(size: DictConfig, topology: dict) -> dict:
    """EnvRunners → a sink that acks each chunk at once: the runners' own speed."""
    with placed(topology) as (plan, phase):
        runners = start_runners(phase, plan, size)
        sink = phase.start(InstantAck, plan.of("learner")[0])
        ray.get([sink.set_runners.remote(runners)] + [r.set_labelers.remote([sink]) for r in runners])
        for runner in runners:
            runner.run.remote(NEVER)
        wait_until(lambda: sum_stats([sink], "received") > 0, float(size.ready_timeout_s), "a first env chunk")
        steps = window(size, lambda: {"env_steps": sum_stats(runners, "env_steps")})
    return {"per_s": steps.median_rate("env_steps"), "mean_per_s": steps.mean_rate("env_steps"),
            "slice_rates": [round(r) for r in steps.rates("env_steps")]}


def whole_pipeline(size: DictConfig, topology: dict) -> dict:
    """EnvRunners → Labelers → SACLearner, as `rlfarm train` wires them."""
    with placed(topology) as (plan, phase):
        labelers = start_labelers(phase, plan, size)
        runners = start_runners(phase, plan, size)
        spaces = ray.get(runners[0].spaces.remote())
        learner = start_learner(phase, plan, spaces)
        return run_farm(size, learner, labelers, runners, runner_args=(NEVER,))


def run_farm(size: DictConfig, learner, labelers: list, runners: list, runner_args: tuple = ()) -> dict:
    """Wire runners (or producers) → labelers → learner, start them, and measure a steady window: transitions
    stored per second, the labelers' share of time in the model call and, on GPUs with NVML, how busy those were."""
    ray.get([learner.set_runners.remote(runners)] + [r.set_labelers.remote(labelers) for r in runners]
            + [l.set_learner.remote(learner) for l in labelers])
    learner.run.remote()
    for labeler in labelers:
        labeler.run.remote()
    for runner in runners:
        runner.run.remote(*runner_args)
    wait_until(lambda: ray.get(learner.stats.remote())["stored"] > 0, float(size.ready_timeout_s),
               "a first labeled chunk at the learner")
    gpus = sorted({g for labeler in labelers for g in assigned_gpus(labeler)})
    sampler = GpuBusySampler(gpus) if gpus and nvml_available() else None

    def read() -> dict:
        return {"stored": ray.get(learner.stats.remote())["stored"], "busy_s": sum_stats(labelers, "busy_s"),
                "produced": sum_stats(runners, "produced")}

    with sampler or nullcontext():
        steady = window(size, read)
    # A bus stores its transitions at once (thousands when the labeler takes a long queue), so slices of the
    # window jump by whole buses: the mean over the whole window goes beside the median slice.
    result = {"per_s": steady.median_rate("stored"), "mean_per_s": steady.mean_rate("stored"),
              "slice_rates": [round(r) for r in steady.rates("stored")],
              "produced_per_s": steady.mean_rate("produced"), "labeler_busy": steady.mean_rate("busy_s") / len(labelers)}
    if sampler:
        result["gpu_busy_percent"] = {str(g): round(p, 1) for g, p in sampler.mean_percent().items()}
    return result

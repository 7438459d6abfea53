"""`rlfarm bench labeler` (issue 4, P1): is the labeling farm as fast as its reward model called directly?

A CLIP-style image tower (clip_factory shapes, random weights; bf16 + torch.compile on CUDA, as
`reward=clip reward.compile=true` runs it), or with `bench.reward=vlm_judge` a VLM judge (vlm_factory shapes, random
weights built on each device; sizes from `judge`/`judge_cpu` over `sizes`), is measured three ways in one run, per
shape:
- direct: the reward model called on batches of `batch` frames preloaded in host memory (the baseline: the
  same call a labeler makes, with nothing around it);
- inline: one call per transition (batch 1), which is what labeling inside the env loop would cost;
- farm: producer actors put chunks of frames in the object store → Labeler actors (bus of `batch` frames) →
  the real SACLearner, which stores and acks them; img/s counted at the learner over a steady window. The learner
  stores whole buses, so the row says how many each labeler delivered in the window and their mean frames: a window
  of a few buses (a judge's bus takes seconds) is lumpy, one with a bus each not a rate at all.
With `bench.distilled=true` (a judge) each judge is also the teacher of `reward=distilled`: its direct call (a warm
student, the judge on `distill.teacher_fraction` of the frames) against the judge's, and its farm against the judge's.
The producers are pre-rendered random frames, not envs, so they outrun the labelers (their own rate, against
an instant ack, is the first row) and the figure is the farm's. The farm may span several GPUs: its row is
per GPU, next to the direct figure of one GPU.
"""
from __future__ import annotations

import gc
import json
import logging
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np
import ray
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from rlfarm.bench.common import median_rate, sizes
from rlfarm.bench.farm import (assigned_gpus, bench_ray, box_spaces, farm_topology, placed, start_learner,
                               steady_window, sum_stats, wait_until)
from rlfarm.bench.stand_ins import ChunkProducer, InstantAck
from rlfarm.config import CONF_DIR
from rlfarm.families import OFFPOLICY
from rlfarm.errors import ConfigError
from rlfarm.rewards.fit_steps import rank_correlation
from rlfarm.rewards.clip_factory import SHAPES, save_random_clip
from rlfarm.rewards.vlm_factory import SHAPES as JUDGE_SHAPES, is_shape
from rlfarm.roles.labeler import Labeler
from rlfarm.topology import plan_topology
from rlfarm.telemetry.gpu_busy import GpuBusySampler, nvml_available

log = logging.getLogger("rlfarm")
REWARDS = ("clip", "vlm_judge")
OBS_DIM, ACT_DIM = 8, 2  # what the learner stores beside the frames: small, as for a MuJoCo task
MIN_BUSES = 4  # buses each labeler delivers in the farm's window, at least, for its figure to mean a rate


def run(cfg: DictConfig, device: str) -> list[dict]:
    size = bench_sizes(cfg, device)
    gpus = reward_gpus(size, device)
    labelers = gpus * int(size.labelers_per_gpu) if gpus else int(size.get("labelers", 1))
    topology = farm_topology("bench-labeler", runners=int(size.producers), labelers=labelers,
                             labeler_gpus=1 / int(size.labelers_per_gpu) if gpus else 0.0, cpus=float(size.cpus_per_actor))
    threads = int(topology["roles"]["labeler"]["threads"])  # the direct calls run on a labeler's threads
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="rlfarm-bench-clip-") as models, \
            bench_ray(plan_topology(topology, OFFPOLICY), device):
        frame = image_size(size.shapes[0])
        rows.append(producers_alone(size, topology, frame))
        for shape in size.shapes:
            shown = len(rows)
            if cfg.reward == "vlm_judge":
                reward_cfg = judge_reward_cfg(cfg, shape, size)
            else:
                reward_cfg = clip_reward_cfg(cfg, save_random_clip(Path(models) / shape, shape), shape, size, device)
            probe = varied_frames(int(size.agreement_frames), reward_cfg["frame_size"]) if cfg.precision else None
            with torch_threads(threads):
                inline, direct, probe_rewards = direct_and_inline(reward_cfg, size, device, probe)
            direct_case = f"{shape} direct b{size.batch}"
            rows += [
                {"case": f"{shape} inline b1", "value": inline, "unit": "img/s", "baseline": None, "batch": 1},
                {"case": direct_case, "value": direct, "unit": "img/s", "baseline": f"{shape} inline b1",
                 "batch": int(size.batch), "threads": threads},
            ]
            if cfg.precision:  # the farm runs the tower in this precision, against its own direct call
                reward_cfg = {**reward_cfg, "precision": cfg.precision}
                with torch_threads(threads):
                    rows += precision_rows(reward_cfg, shape, size, device, probe, probe_rewards, direct_case)
                direct_case = rows[-2]["case"]
            farm = farm_rate(reward_cfg, size, topology, image_size(shape))
            per_gpu = farm["img_per_s"] / max(gpus, 1)
            rows.append({"case": f"{shape} farm per GPU", "value": per_gpu, "unit": "img/s", "baseline": direct_case,
                         "batch": int(size.batch), "gpus": gpus, "labelers": labelers,
                         "farm_img_per_s": farm["img_per_s"], "vs_inline": per_gpu / inline,
                         **{k: v for k, v in farm.items() if k != "img_per_s"}})
            if cfg.reward == "vlm_judge" and cfg.distilled:
                rows += distilled_rows(cfg, reward_cfg, shape, size, device, topology, gpus, threads)
            for row in rows[shown:]:  # as they come: a GPU run cut short by its time limit keeps the shapes done
                log.info("bench row: %s", json.dumps(row))
    return rows


def precision_rows(reward_cfg: dict, shape: str, size: DictConfig, device: str, probe: np.ndarray,
                   reference: np.ndarray, direct_case: str) -> list[dict]:
    """The tower at `reward_cfg`'s precision: its direct img/s against the default precision's, and how well its
    rewards keep the default's order (Spearman's rank correlation over the `agreement_frames` probe frames)."""
    model = instantiate(reward_cfg)
    model.setup("cuda:0" if device == "cuda" else "cpu")
    direct = direct_rate(model, size, device, reward_cfg["frame_size"])
    rewards = model({"frames": probe})
    del model
    release_gpu_memory(device)
    precision = reward_cfg["precision"]
    return [{"case": f"{direct_case} {precision}", "value": direct, "unit": "img/s", "baseline": direct_case,
             "batch": int(size.batch)},
            {"case": f"{shape} {precision} rank agreement", "value": rank_correlation(reference, rewards),
             "unit": "spearman", "baseline": None, "frames": len(probe)}]


def reward_gpus(size: DictConfig, device: str) -> int:
    """GPUs the farm uses: `gpus` of them (null: every visible one); none on cpu."""
    if device != "cuda":
        return 0
    visible = torch.cuda.device_count()
    return visible if size.gpus is None else min(int(size.gpus), visible)


def bench_sizes(cfg: DictConfig, device: str) -> DictConfig:
    """`sizes` (`sizes_cpu` on CPU), with a judge's own keys over them for bench.reward=vlm_judge."""
    if cfg.reward not in REWARDS:
        raise ConfigError(f"bench.reward={cfg.reward!r} is not a farm reward", f"set bench.reward={' or '.join(REWARDS)}")
    if cfg.precision is not None and (cfg.reward != "clip" or cfg.precision != "fp8" or device != "cuda"):
        raise ConfigError(f"bench.precision={cfg.precision} with bench.reward={cfg.reward} on {device}: only the CLIP "
                          "tower has an fp8 precision, on an Ada or Hopper GPU", "drop bench.precision, or run "
                          "bench.reward=clip bench.precision=fp8 with device=cuda")
    size = sizes(cfg, device)
    if cfg.reward != "vlm_judge":
        return size
    judge = cfg.judge_cpu if device == "cpu" else cfg.judge
    return OmegaConf.merge(*(OmegaConf.to_container(node, resolve=True) for node in (size, judge)))  # new keys too


def image_size(shape: str) -> int:
    return int((JUDGE_SHAPES if is_shape(shape) else SHAPES)[shape][0]["image_size"])


def judge_reward_cfg(cfg: DictConfig, shape: str, size: DictConfig) -> dict:
    """conf/reward/vlm_judge.yaml for a random-weight shape (built on each labeler's device), frames at its input size."""
    reward = OmegaConf.load(CONF_DIR / "reward" / "vlm_judge.yaml")
    reward.model, reward.frame_size, reward.max_batch, reward.dtype = shape, image_size(shape), int(size.max_batch), cfg.dtype
    return OmegaConf.to_container(reward, resolve=True)


def distilled_reward_cfg(cfg: DictConfig, teacher_cfg: dict, side: int) -> dict:
    """conf/reward/distilled.yaml with `teacher_cfg` as its teacher and bench.distill's settings over its own (the
    student's frames no larger than the judge's)."""
    reward = OmegaConf.load(CONF_DIR / "reward" / "distilled.yaml")
    reward.pop("defaults")
    reward.seed = 0  # the run's seed in a train config; here there is none
    reward = OmegaConf.to_container(OmegaConf.merge(reward, cfg.distill), resolve=True)
    reward["student_frame_size"] = min(int(reward["student_frame_size"]), side)
    return {**reward, "teacher": teacher_cfg}


def distilled_rows(cfg: DictConfig, teacher_cfg: dict, shape: str, size: DictConfig, device: str, topology: dict,
                   gpus: int, threads: int) -> list[dict]:
    """reward=distilled with the judge as its teacher: its direct img/s (a warm student) against the judge's direct
    call, with what the student reported, and its farm against the judge's farm."""
    reward_cfg = distilled_reward_cfg(cfg, teacher_cfg, image_size(shape))
    with torch_threads(threads):
        direct, stats = distilled_direct(reward_cfg, size, device)
    farm = farm_rate(reward_cfg, size, topology, image_size(shape))
    per_gpu = farm["img_per_s"] / max(gpus, 1)
    return [{"case": f"{shape} distilled direct b{size.batch}", "value": direct, "unit": "img/s",
             "baseline": f"{shape} direct b{size.batch}", "batch": int(size.batch), **stats},
            {"case": f"{shape} distilled farm per GPU", "value": per_gpu, "unit": "img/s",
             "baseline": f"{shape} farm per GPU", "batch": int(size.batch), "gpus": gpus,
             "farm_img_per_s": farm["img_per_s"], **{k: v for k, v in farm.items() if k != "img_per_s"}}]


def distilled_direct(reward_cfg: dict, size: DictConfig, device: str) -> tuple[float, dict]:
    """(img/s of the distilled reward called directly once its student is warm, its stats then). Warming takes
    min_teacher_labels / batch calls of the teacher on every frame; a student that is still cold after twice that
    (a teacher it cannot follow, warm_agreement too high) is measured cold, and its stats say so."""
    model = instantiate(reward_cfg)
    model.setup("cuda:0" if device == "cuda" else "cpu")
    warming = {"frames": varied_frames(int(size.batch), model.frame_size)}
    for _ in range(2 * -(-model.settings.min_teacher_labels // int(size.batch)) + 1):
        if model.warm:
            break
        model(warming)
    direct = direct_rate(model, size, device, model.frame_size)
    stats = model.stats()
    del model
    release_gpu_memory(device)
    return direct, stats


def clip_reward_cfg(cfg: DictConfig, model: Path, shape: str, size: DictConfig, device: str) -> dict:
    """conf/reward/clip.yaml for this model, frames at its input size (no resize), compiled on CUDA."""
    reward = OmegaConf.load(CONF_DIR / "reward" / "clip.yaml")
    reward.model, reward.frame_size, reward.max_batch = str(model), image_size(shape), int(size.batch)
    reward.dtype, reward.compile = cfg.dtype, bool(cfg.compile) and device == "cuda"
    return OmegaConf.to_container(reward, resolve=True)


def frames(n: int, side: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, side, side, 3), dtype=np.uint8)


def varied_frames(n: int, side: int, seed: int = 1) -> np.ndarray:
    """Frames that differ as a scene's do (each its own colour and brightness, plus pixel noise): a tower's rewards of
    pure noise frames hardly differ, so any precision's rounding would reorder them."""
    rng = np.random.default_rng(seed)
    colour = rng.uniform(0, 255, size=(n, 1, 1, 3))
    noise = rng.normal(0, 24, size=(n, side, side, 3))
    return np.clip(colour + noise, 0, 255).astype(np.uint8)


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """The direct calls on as many CPU threads as a labeler has (its placement's `threads`): "the same call a labeler
    makes". The driver's default, a thread per core, waits at every parallel region for the core another process holds
    (the farm's actors, anything else on the host), and its figure would follow the host's load, not the model."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def direct_and_inline(reward_cfg: dict, size: DictConfig, device: str, probe: np.ndarray | None = None
                      ) -> tuple[float, float, np.ndarray | None]:
    """(inline img/s at batch 1, direct img/s at batch `size.batch`, its rewards of the `probe` frames if given) of
    one model in this process."""
    model = instantiate(reward_cfg)
    model.setup("cuda:0" if device == "cuda" else "cpu")
    direct = direct_rate(model, size, device, reward_cfg["frame_size"])
    singles = [{"frames": one} for one in frames(int(size.inline_frames), reward_cfg["frame_size"])[:, None]]
    inline = median_rate(lambda: [model(one) for one in singles], len(singles), device, repeats=int(size.repeats))
    probe_rewards = None if probe is None else model({"frames": probe})
    del model
    release_gpu_memory(device)
    return inline, direct, probe_rewards


def direct_rate(model, size: DictConfig, device: str, side: int) -> float:
    """img/s of `direct_batches` calls on `batch` frames each, preloaded in host memory."""
    batch = {"frames": frames(int(size.batch), side)}
    calls = int(size.direct_batches)
    return median_rate(lambda: [model(batch) for _ in range(calls)], calls * int(size.batch), device,
                       repeats=int(size.repeats))


def release_gpu_memory(device: str) -> None:
    """Free what the direct measurement held on GPU 0 before the farm's labelers use it."""
    if device == "cuda":
        torch._dynamo.reset()
        gc.collect()
        torch.cuda.empty_cache()


def chunk_fields(side: int) -> dict:
    return {"frames": ([side, side, 3], "uint8"), "obs": ([OBS_DIM], "float32"), "next_obs": ([OBS_DIM], "float32"),
            "action": ([ACT_DIM], "float32"), "terminated": ([], "bool"), "truncated": ([], "bool")}


def start_producers(phase, plan, size: DictConfig, side: int) -> list:
    return [phase.start(ChunkProducer, p, p.index, chunk_fields(side), int(size.chunk_frames), int(size.credits))
            for p in plan.of("env_runner")]


def producers_alone(size: DictConfig, topology: dict, side: int) -> dict:
    """The producers against a sink that acks at once: what they could feed the farm at most."""
    with placed(topology) as (plan, phase):
        producers = start_producers(phase, plan, size, side)
        sink = phase.start(InstantAck, plan.of("learner")[0])
        ray.get([sink.set_runners.remote(producers)] + [p.set_labelers.remote([sink]) for p in producers])
        for producer in producers:
            producer.run.remote()
        wait_until(lambda: sum_stats([sink], "received") > 0, float(size.ready_timeout_s), "a first chunk")
        window = steady_window(lambda: {"received": sum_stats([sink], "received")}, float(size.warmup_s),
                               float(size.window_s), int(size.repeats))
    return {"case": "producers alone", "value": window.median_rate("received"), "unit": "frames/s",
            "baseline": None, "producers": len(producers), "chunk_frames": int(size.chunk_frames), "frame": side}


def farm_rate(reward_cfg: dict, size: DictConfig, topology: dict, side: int) -> dict:
    """Producers → Labelers (the real role, bus of `size.batch`) → the real SACLearner; img/s stored."""
    with placed(topology) as (plan, phase):
        labelers = [phase.start(Labeler, p, p.index, reward_cfg, int(size.batch), float(size.bus_timeout_s),
                                p.threads) for p in plan.of("labeler")]
        learner = start_learner(phase, plan, box_spaces(OBS_DIM, ACT_DIM))
        producers = start_producers(phase, plan, size, side)
        ray.get([learner.set_runners.remote(producers)] + [p.set_labelers.remote(labelers) for p in producers]
                + [l.set_learner.remote(learner) for l in labelers])
        learner.run.remote()
        for actor in (*labelers, *producers):
            actor.run.remote()
        # Each labeler's first buses pay model loading and compilation: measure after two of them.
        wait_until(lambda: all(s["batches"] >= 2 for s in ray.get([l.stats.remote() for l in labelers])),
                   float(size.ready_timeout_s), "two buses labeled by every labeler")
        gpus = sorted({g for l in labelers for g in assigned_gpus(l)})

        def read() -> dict:
            stats = ray.get([l.stats.remote() for l in labelers])
            return {"stored": ray.get(learner.stats.remote())["stored"],
                    **{key: float(sum(s[key] for s in stats)) for key in ("busy_s", "labeled", "batches")}}

        sampler = GpuBusySampler(gpus) if gpus and nvml_available() else None
        with sampler or nullcontext():
            window = steady_window(read, float(size.warmup_s), float(size.window_s), int(size.repeats))
    buses, labeled = (window.counters[-1][key] - window.counters[0][key] for key in ("batches", "labeled"))
    result = {"img_per_s": window.median_rate("stored"), "farm_mean_img_per_s": window.mean_rate("stored"),
              "labeler_busy": window.mean_rate("busy_s") / len(labelers),
              "buses_per_labeler": buses / len(labelers), "frames_per_bus": labeled / buses if buses else 0.0}
    if result["buses_per_labeler"] < MIN_BUSES:
        log.warning("bench: the labelers delivered %.1f buses each in the %g s window: the farm's figure, counted in "
                    "whole buses, may be off by a bus per labeler; raise window_s (bench.judge.window_s for the judge)",
                    result["buses_per_labeler"], float(size.window_s))
    if sampler:
        result["gpu_busy_percent"] = {str(g): round(p, 1) for g, p in sampler.mean_percent().items()}
    return result

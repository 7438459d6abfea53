"""`rlfarm bench labeler`: the command on CPU (tiny tower), the stand-in runner against the real roles, and the
GPU path (device only)."""
import json
import time

import pytest
from omegaconf import OmegaConf

from helpers import rlfarm
from rlfarm.bench.farm import box_spaces, store_only_learner_args
from rlfarm.bench.stand_ins import ChunkProducer
from rlfarm.config import compose
from rlfarm.roles.labeler import Labeler
from rlfarm.roles.sac_learner import SACLearner


@pytest.mark.slow  # Ray, a CLIP tower and two phases of actors
def test_labeler_bench_command_on_cpu_writes_every_figure_with_its_baseline(tmp_path):
    # shorter windows (the tiny tower labels a 64-frame bus in milliseconds: still dozens of buses a slice)
    out = rlfarm("bench", "labeler", "device=cpu", "bench.sizes_cpu.warmup_s=0.3", "bench.sizes_cpu.window_s=1.5",
                 "bench.sizes_cpu.inline_frames=8", f"hydra.run.dir={tmp_path / 'run'}", timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "run" / "bench.json").read_text())
    rows = {row["case"]: row for row in result["rows"]}
    assert list(rows) == ["producers alone", "tiny inline b1", "tiny direct b64", "tiny farm per GPU"]
    assert all(row["value"] > 0 for row in rows.values())
    assert rows["tiny direct b64"]["baseline"] == "tiny inline b1"
    farm = rows["tiny farm per GPU"]
    assert farm["baseline"] == "tiny direct b64"
    assert farm["ratio"] == pytest.approx(farm["value"] / rows["tiny direct b64"]["value"])
    assert farm["gpus"] == 0 and farm["labelers"] == 1 and 0 < farm["labeler_busy"] <= 1
    assert farm["buses_per_labeler"] > 0 and 0 < farm["frames_per_bus"] <= 64  # a bus at most, backlog or not
    assert result["device_name"].startswith("cpu: ")
    assert "tiny farm per GPU" in out.stdout  # the table


def test_producer_plays_a_runner_credits_and_acks_with_the_real_roles(ray_cpu):
    """A producer spends a credit per chunk and gets it back only when the learner acks: a real Labeler labels
    its chunks, a bus (8 transitions) at a time even when both wait in its queue; a real SACLearner whose loop is
    not started stores nothing and acks nothing."""
    ray = ray_cpu
    fields = {"obs": ([3], "float32"), "next_obs": ([3], "float32"), "action": ([1], "float32"),
              "terminated": ([], "bool"), "truncated": ([], "bool"), "env_reward": ([], "float32")}
    producer = ray.remote(ChunkProducer).options(max_concurrency=4).remote(0, fields, 8, 2)
    reward = OmegaConf.to_container(compose("train", []).reward)
    labeler = ray.remote(Labeler).options(max_concurrency=4).remote(0, reward, 8, 0.01, 1)
    learner = ray.remote(SACLearner).options(max_concurrency=4).remote(*store_only_learner_args(box_spaces(3, 1)))
    ray.get([producer.set_labelers.remote([labeler]), labeler.set_learner.remote(learner),
             learner.set_runners.remote([producer])])
    done = producer.run.remote()
    deadline = time.monotonic() + 20
    while ray.get(labeler.stats.remote())["queued"] < 16 and time.monotonic() < deadline:
        time.sleep(0.1)
    labeler.run.remote()  # both chunks queued: a backlog
    while ray.get(labeler.stats.remote())["labeled"] < 16 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    assert ray.get(producer.stats.remote())["chunks"] == 2  # two credits spent, none back: it waits
    stats = ray.get(labeler.stats.remote())
    assert stats["labeled"] == 16 and stats["batches"] == 2  # one bus per chunk, not one call of the whole backlog
    ray.get(producer.ack.remote([0]))
    time.sleep(1.0)
    assert ray.get(producer.stats.remote())["chunks"] == 3  # one credit back → exactly one more chunk
    ray.get([producer.stop.remote(), labeler.stop.remote()])
    assert ray.get(done, timeout=10)["produced"] == 24


@pytest.mark.gpu
def test_labeler_bench_on_gpu_small():
    from rlfarm.bench import labeler

    cfg = compose("bench", ["bench=labeler", "bench.sizes.shapes=[tiny]", "bench.sizes.batch=64",
                            "bench.sizes.chunk_frames=64", "bench.sizes.window_s=2", "bench.sizes.gpus=1"])
    rows = {row["case"]: row for row in labeler.run(cfg.bench, "cuda")}
    assert rows["tiny farm per GPU"]["gpus"] == 1 and rows["tiny farm per GPU"]["labelers"] == 2
    assert all(row["value"] > 0 for row in rows.values())


def test_judge_bench_takes_its_own_sizes_and_a_judge_reward_of_each_shape():
    """bench.reward=vlm_judge: the judge's keys over the sizes, a reward config the labelers build on their device."""
    from hydra.utils import instantiate

    from rlfarm.bench.labeler import bench_sizes, image_size, judge_reward_cfg
    from rlfarm.errors import ConfigError

    cfg = compose("bench", ["bench=labeler", "bench.reward=vlm_judge"]).bench
    gpu, cpu = bench_sizes(cfg, "cuda"), bench_sizes(cfg, "cpu")
    assert list(gpu.shapes) == ["qwen2-vl-2b_shape", "llava-1.5-7b_shape"] and gpu.labelers_per_gpu == 2
    assert list(cpu.shapes) == ["tiny_shape"] and cpu.labelers == 1
    assert [image_size(shape) for shape in gpu.shapes] == [224, 336]
    reward = instantiate(judge_reward_cfg(cfg, "llava-1.5-7b_shape", gpu))
    assert (reward.model, reward.frame_size, reward.max_batch, reward.dtype) == ("llava-1.5-7b_shape", 336, 32, "bfloat16")
    with pytest.raises(ConfigError, match="bench.reward='blip' is not a farm reward"):
        bench_sizes(compose("bench", ["bench=labeler", "bench.reward=blip"]).bench, "cpu")


def test_distilled_judge_bench_warms_its_student_before_it_times_it(one_torch_thread):
    """bench.distilled=true: reward=distilled with the judge as teacher, its student warm (on teacher labels alone: a
    random judge's answers are noise) before the direct call is timed."""
    from rlfarm.bench.labeler import bench_sizes, distilled_direct, distilled_reward_cfg, judge_reward_cfg

    cfg = compose("bench", ["bench=labeler", "bench.reward=vlm_judge", "bench.distilled=true",
                            "bench.distill.min_teacher_labels=64"]).bench
    size = bench_sizes(cfg, "cpu")
    reward = distilled_reward_cfg(cfg, judge_reward_cfg(cfg, "tiny_shape", size), 32)
    assert (reward["teacher"]["model"], reward["student_frame_size"], reward["teacher_fraction"]) == ("tiny_shape", 32, 0.1)
    rate, stats = distilled_direct(reward, size, "cpu")
    assert rate > 0 and stats["distill_warm"] and stats["distill_teacher_fraction"] < 1, stats


@pytest.mark.gpu
def test_judge_bench_on_gpu_small():
    from rlfarm.bench import labeler

    cfg = compose("bench", ["bench=labeler", "bench.reward=vlm_judge", "bench.judge.shapes=[tiny_shape]",
                            "bench.judge.window_s=2", "bench.sizes.gpus=1"])
    rows = {row["case"]: row for row in labeler.run(cfg.bench, "cuda")}
    assert rows["tiny_shape farm per GPU"]["gpus"] == 1 and all(row["value"] > 0 for row in rows.values())


def test_rank_agreement_and_the_fp8_option_on_cpu():
    import numpy as np

    from rlfarm.bench.labeler import bench_sizes, rank_correlation
    from rlfarm.errors import ConfigError

    a = np.random.default_rng(0).normal(size=1000)
    assert rank_correlation(a, np.exp(a)) == pytest.approx(1.0)  # order kept: 1 whatever the scale
    assert rank_correlation(a, -a) == pytest.approx(-1.0)
    with pytest.raises(ConfigError, match="only the CLIP tower has an fp8 precision"):
        bench_sizes(compose("bench", ["bench=labeler", "bench.precision=fp8"]).bench, "cpu")

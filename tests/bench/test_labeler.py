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


@pytest.mark.slow  # Ray, a CLIP tower and three phases of actors: ~30-60 s on two cores
def test_labeler_bench_command_on_cpu_writes_every_figure_with_its_baseline(tmp_path):
    out = rlfarm("bench", "labeler", "device=cpu", f"hydra.run.dir={tmp_path / 'run'}", timeout=600)
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
    assert result["device_name"].startswith("cpu: ")
    assert "tiny farm per GPU" in out.stdout  # the table


def test_producer_plays_a_runner_credits_and_acks_with_the_real_roles(ray_cpu):
    """A producer spends a credit per chunk and gets it back only when the learner acks: a real Labeler labels
    its chunks; a real SACLearner whose loop is not started stores nothing and acks nothing."""
    ray = ray_cpu
    fields = {"obs": ([3], "float32"), "next_obs": ([3], "float32"), "action": ([1], "float32"),
              "terminated": ([], "bool"), "truncated": ([], "bool"), "env_reward": ([], "float32")}
    producer = ray.remote(ChunkProducer).options(max_concurrency=4).remote(0, fields, 8, 2)
    reward = OmegaConf.to_container(compose("train", []).reward)
    labeler = ray.remote(Labeler).options(max_concurrency=4).remote(0, reward, 8, 0.01, 1)
    learner = ray.remote(SACLearner).options(max_concurrency=4).remote(*store_only_learner_args(box_spaces(3, 1)))
    ray.get([producer.set_labelers.remote([labeler]), labeler.set_learner.remote(learner),
             learner.set_runners.remote([producer])])
    labeler.run.remote()
    done = producer.run.remote()
    deadline = time.monotonic() + 20
    while ray.get(labeler.stats.remote())["labeled"] < 16 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    assert ray.get(producer.stats.remote())["chunks"] == 2  # two credits spent, none back: it waits
    assert ray.get(labeler.stats.remote())["labeled"] == 16
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

"""`rlfarm` as a user runs it: a subprocess, real Hydra composition, real Ray, then read the run directory."""
import json
import time

from helpers import TINY_SAC, rlfarm


def test_help_lists_commands():
    out = rlfarm("--help")
    assert out.returncode == 0
    assert "train" in out.stdout and "plan" in out.stdout


TINY = ["total_env_steps=600", *TINY_SAC, "run.live=false"]


def test_multirun_sweep_gives_one_run_dir_each(tiny_sweep):
    """`rlfarm train -m seed=1,2` (the shared sweep of tests/conftest.py): one complete run directory per point."""
    summaries = sorted(tiny_sweep.glob("*/summary.json"))
    assert len(summaries) == 2
    seeds = {json.loads((p.parent / "config.yaml").read_text().split("seed: ")[1].split("\n")[0]) for p in summaries}
    assert seeds == {1, 2}


def test_plan_with_declared_gpus_prints_gpu_ids():
    out = rlfarm("plan", "topology=split_1_3", "ray.num_gpus=4", "ray.num_cpus=16")
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    labeler_rows = [line for line in lines if "labeler[" in line]
    learner_row = next(line for line in lines if "learner[0]" in line)
    assert len(labeler_rows) == 6 and all("reward" in row for row in labeler_rows)
    assert "train" in learner_row
    runner_rows = [line for line in lines if "env_runner[" in line]  # rendering off the learner's GPU (issue 36)
    assert len(runner_rows) == 8 and all("GPU 1" in row or "GPU 2" in row or "GPU 3" in row for row in runner_rows)


def test_train_writes_a_complete_run_directory_with_clip_reward_on_rendered_halfcheetah(tmp_path):
    """reward=clip with a tiny CLIP saved to disk and loaded by path; frames rendered headless by the runners. The
    run directory is complete and its accounting exact (one run for both checks: a Ray session is the cost)."""
    from rlfarm.rewards.clip_factory import save_random_clip

    clip = save_random_clip(tmp_path / "clip", "tiny")
    run_dir = tmp_path / "run"
    started = time.monotonic()
    out = rlfarm("train", f"hydra.run.dir={run_dir}", "env=halfcheetah", "reward=clip", f"reward.model={clip}",
                 "reward.frame_size=32", "total_env_steps=256", "algo.learning_starts=64", "algo.batch_size=32",
                 "algo.chunk_steps=32", "model.actor.hidden=[32,32]", "model.critic.hidden=[32,32]", "run.live=false",
                 "+env.kwargs.max_episode_steps=64")  # episodes end (returns logged): 4 of them
    elapsed = time.monotonic() - started
    assert out.returncode == 0, out.stderr[-2000:]
    for name in ("config.yaml", "train.log", "metrics.jsonl", "summary.json", ".hydra/config.yaml"):
        assert (run_dir / name).exists(), name
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == 256
    # exactly-once accounting: everything produced was labeled and stored once
    assert summary["transitions_produced"] == summary["transitions_labeled"] == summary["transitions_stored"] == 256
    assert summary["updates"] == 256 - 64 + 1
    assert summary["episode_return_mean"] is not None and summary["wall_s"] > 0
    # time from the command to the first env step: after the process started, before the run ended
    assert 0 < summary["startup_s"] < elapsed
    assert f"First env step {summary['startup_s']:.1f} s after the command started" in out.stdout + out.stderr
    assert (run_dir / "checkpoints" / "final.pt").exists()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows and {"env_steps", "env_steps_per_s", "labeled_per_s", "updates_per_s", "labeling_lag_s",
                     "buffer_size", "episode_return_mean"} <= set(rows[-1])
    log = (run_dir / "train.log").read_text()
    assert "Done: sac on HalfCheetah-v5" in log
    import torch
    state = torch.load(run_dir / "checkpoints" / "final.pt", weights_only=True)
    assert state["updates"] == summary["updates"]
    assert "ClipReward" in log
    # 1 runner x 1 env x 32 steps x 2 credits in flight against a 256-frame bus, but the labeler is on CPU: its
    # buses fire on their timeout, nothing starves, and the run does not warn against its own defaults
    assert "the reward model will wait for frames" not in log


def test_submitit_local_launcher_runs_the_job(tmp_path):
    out = rlfarm("train", "-m", "hydra/launcher=submitit_local", f"hydra.sweep.dir={tmp_path}/sweep",
                 "hydra.sweep.subdir=${hydra.job.num}", "seed=3", *TINY[1:], "total_env_steps=300", timeout=400)
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(list((tmp_path / "sweep").glob("*/summary.json"))) == 1

"""`rlfarm fit-reward` as a user runs it, then `rlfarm train` on what it wrote (issue 19).

The learning test fits a CNN to Pendulum frames (64 px) against the env's reward, trains SAC (10k env steps) on the
fitted reward alone (the labelers run it; the agent never sees the env's reward, which is still logged) and compares the true
return with the env-reward run's (`sac_pendulum_run`, the same config, shared with the SAC learning test), both
over the same evaluation episodes, against a random policy's.
"""
import json

import numpy as np
import pytest

from omegaconf import OmegaConf

from helpers import PENDULUM_SAC_64, RandomActor, eval_returns, metrics_rows, read_summary, rlfarm, train

EVAL_EPISODES = 30
# Short collection episodes: a random policy mostly hangs the pendulum down; resets every 50 steps show the
# upper half (where the reward is made) often enough.
# A CNN of half the default width: the labeler runs it on every frame of the run, on CI's 2 cores beside the learner.
FIT = ["frames=5000", "+env.kwargs.max_episode_steps=50", "fit.epochs=4", "net.channels=[16,32,32]", "net.hidden=128"]


def test_fit_reward_writes_a_model_a_report_and_plots(tmp_path):
    out_dir = tmp_path / "fit"
    out = rlfarm("fit-reward", f"hydra.run.dir={out_dir}", "frames=320", "num_envs=2", "fit.epochs=2",
                 "+env.kwargs.max_episode_steps=20", "net.channels=[8,8,8]", "net.hidden=16", "report_frames=4")
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((out_dir / "report.json").read_text())
    assert report["frames"] == 320 and report["episodes"] == 16 and report["target"] == "env_reward"
    assert report["held_out"]["frames"] + report["train_frames"] == 320 and report["held_out"]["frames"] % 20 == 0
    assert [c["epoch"] for c in report["curve"]] == [0, 1, 2] and len(report["calibration"]) == 10
    for name in ("reward_model.pt", "calibration.png", "frames.png", "config.yaml", "fit_reward.log"):
        assert (out_dir / name).is_file(), name
    assert "rlfarm train reward=model reward.model=" in out.stderr + out.stdout
    again = rlfarm("fit-reward", f"hydra.run.dir={out_dir}", "frames=300")
    assert again.returncode == 2 and "already holds a finished fit" in again.stderr


@pytest.mark.slow
def test_frames_from_a_trained_runs_policy_stacked_by_two(tiny_sweep, tmp_path):
    out = rlfarm("fit-reward", f"hydra.run.dir={tmp_path / 'fit'}", f"policy=[random,{tiny_sweep / '0'}]", "frames=160",
                 "num_envs=2", "frame_stack=2", "fit.epochs=1", "+env.kwargs.max_episode_steps=20", "net.hidden=16")
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "fit" / "report.json").read_text())
    assert report["policy"][0] == "random" and report["policy_checkpoint"].endswith(".pt")  # one share each
    assert report["frame_stack"] == 2 and report["frames"] == 160 and report["episodes"] == 8
    from rlfarm.rewards import ModuleReward

    reward = ModuleReward(model=str(tmp_path / "fit" / "reward_model.pt"))
    assert (reward.frame_size, reward.frame_stack) == (64, 2)  # what the runners will render
    from rlfarm.commands.fit_reward import policy_run
    from rlfarm.config import compose
    from rlfarm.errors import ConfigError

    cfg = compose("fit_reward", [f"policy={tiny_sweep / '0'}", "env=halfcheetah"])  # the preflight's check, in process
    with pytest.raises(ConfigError, match="was trained on Pendulum-v1, not HalfCheetah-v5"):
        policy_run(cfg, str(cfg.policy))


@pytest.mark.slow
def test_sac_learns_from_a_reward_fitted_to_frames(tmp_path, sac_pendulum_run):
    fit_dir, run_dir = tmp_path / "fit", tmp_path / "run"
    out = rlfarm("fit-reward", f"hydra.run.dir={fit_dir}", *FIT)
    assert out.returncode == 0, out.stderr[-3000:]
    held_out = json.loads((fit_dir / "report.json").read_text())["held_out"]
    assert held_out["r2"] > 0.5, held_out  # one frame shows the angle, not the speed: ~0.75 is near the ceiling

    out = train(run_dir, "reward=model", f"reward.model={fit_dir / 'reward_model.pt'}",
                *PENDULUM_SAC_64, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = read_summary(run_dir)
    assert summary["transitions_produced"] == summary["transitions_labeled"] == summary["transitions_stored"] == 10_000
    rows = [r for r in metrics_rows(run_dir) if r.get("labeled_reward_mean") is not None]
    assert rows and all(r["env_reward_mean"] is not None and r["reward_gap_mean"] > 0 for r in rows)  # not the env's

    from rlfarm.evaluation import play_episode

    random = RandomActor([-2.0], [2.0])
    env_cfg = OmegaConf.create({"id": "Pendulum-v1", "kwargs": {}})
    random_mean = np.mean([play_episode(random, env_cfg, seed=10_000 + i).episode_return for i in range(EVAL_EPISODES)])
    env_mean, fitted_mean = np.mean(eval_returns(sac_pendulum_run, EVAL_EPISODES)), np.mean(eval_returns(run_dir, EVAL_EPISODES))
    assert fitted_mean - random_mean >= 0.5 * (env_mean - random_mean), (random_mean, env_mean, fitted_mean)

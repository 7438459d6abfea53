"""`rlfarm fit-reward` as a user runs it (issue 19). SAC learning from a fitted reward is in
tests/loops/test_sac_learns.py, beside the env-reward run it is compared with (one module: one worker builds it)."""
import json

import pytest

from helpers import rlfarm


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

"""SAC learns Pendulum through the whole pipeline (runner → labeler → learner), as `make run` does, from the env's
reward and from a reward fitted to its frames (`rlfarm fit-reward`, issue 19).

The env-reward run (`sac_pendulum_run`, built once for this module's two tests) is `make run`'s default config with
64-unit networks instead of 256 (a sixteenth of the learner's matmul work: on CI's CPU the learner's updates are the
run's cost), 10k env steps instead of 20k and updates from 1,000 stored transitions instead of 5,000: the same env and
reward path, 9,000 updates instead of 15,000 (make run's longer warm-up is measured in docs/benchmarks.md).

The bar (mean return >= -200 within 10k env steps; a random policy scores about -1200) is judged on the trained
policy over 30 evaluation episodes (`rlfarm.evaluation`, the mean action), not on the last 10 training episodes:
Pendulum's returns depend on the start angle (a good policy scores 0 to -350), so a 10-episode mean of sampled
actions swings by tens of points between consecutive windows of the same policy.

The fitted-reward test fits a CNN to Pendulum frames (64 px) against the env's reward, trains SAC (10k env steps) on
the fitted reward alone (the labelers run it; the agent never sees the env's reward, which is still logged) and
compares the true return with the env-reward run's, both over the same evaluation episodes, against a random
policy's."""
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


@pytest.fixture(scope="module")
def sac_pendulum_run(tmp_path_factory):
    """SAC on Pendulum with the env's reward (helpers.PENDULUM_SAC_64)."""
    run_dir = tmp_path_factory.mktemp("sac_pendulum") / "run"
    out = train(run_dir, *PENDULUM_SAC_64, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return run_dir


@pytest.mark.slow
def test_sac_learns_pendulum_within_10k_env_steps(sac_pendulum_run):
    run_dir = sac_pendulum_run
    summary = read_summary(run_dir)
    assert summary["env_steps"] == 10_000
    assert summary["transitions_produced"] == summary["transitions_labeled"] == summary["transitions_stored"]
    assert summary["episode_return_mean"] >= -500, summary  # training episodes, far above random already

    returns = eval_returns(run_dir, EVAL_EPISODES)
    assert np.mean(returns) >= -200, returns


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

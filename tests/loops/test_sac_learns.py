"""SAC learns Pendulum through the whole pipeline (runner → labeler → learner), as `make run` does.

The run (conftest's `sac_pendulum_run`, shared with the fitted-reward test) is `make run`'s default config with
64-unit networks instead of 256 (a sixteenth of the learner's matmul work: on CI's CPU the learner's updates are the
run's cost), 10k env steps instead of 20k and updates from 1,000 stored transitions instead of 5,000: the same env and
reward path, 9,000 updates instead of 15,000 (make run's longer warm-up is measured in docs/benchmarks.md).

The bar (mean return >= -200 within 10k env steps; a random policy scores about -1200) is judged on the trained
policy over 30 evaluation episodes (`rlfarm.evaluation`, the mean action), not on the last 10 training episodes:
Pendulum's returns depend on the start angle (a good policy scores 0 to -350), so a 10-episode mean of sampled
actions swings by tens of points between consecutive windows of the same policy."""
import numpy as np
import pytest

from helpers import eval_returns, read_summary

EVAL_EPISODES = 30


@pytest.mark.slow
def test_sac_learns_pendulum_within_10k_env_steps(sac_pendulum_run):
    run_dir = sac_pendulum_run
    summary = read_summary(run_dir)
    assert summary["env_steps"] == 10_000
    assert summary["transitions_produced"] == summary["transitions_labeled"] == summary["transitions_stored"]
    assert summary["episode_return_mean"] >= -500, summary  # training episodes, far above random already

    returns = eval_returns(run_dir, EVAL_EPISODES)
    assert np.mean(returns) >= -200, returns

"""SAC learns Pendulum through the whole pipeline (runner → labeler → learner), as `make run` does.

The run is `make run`'s default config with 64-unit networks instead of 256: the same env, budget, reward path
and bar at a sixteenth of the learner's matmul work (on CI's CPU the learner's updates are the run's cost)."""
import json

import pytest

from helpers import rlfarm


@pytest.mark.slow
def test_sac_learns_pendulum_within_20k_env_steps(tmp_path):
    run_dir = tmp_path / "run"
    out = rlfarm("train", f"hydra.run.dir={run_dir}", "run.live=false",
                 "model.actor.hidden=[64,64]", "model.critic.hidden=[64,64]", timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == 20_000
    assert summary["transitions_produced"] == summary["transitions_labeled"] == summary["transitions_stored"]
    # Acceptance bar: mean return of the last 10 episodes >= -200 within 20k env steps (random policy: about -1200).
    assert summary["episode_return_mean"] >= -200, summary

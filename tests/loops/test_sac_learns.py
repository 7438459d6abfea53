"""SAC learns Pendulum through the whole pipeline (runner → labeler → learner), as `make run` does."""
import json
import os
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_default_run_learns_pendulum(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    out = subprocess.run([sys.executable, "-m", "rlfarm.cli", "train", f"hydra.run.dir={run_dir}", "run.live=false"],
                         capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == 20_000
    assert summary["transitions_produced"] == summary["transitions_labeled"] == summary["transitions_stored"]
    # Acceptance bar: mean return of the last 10 episodes >= -200 within 20k env steps (random policy: about -1200).
    assert summary["episode_return_mean"] >= -200, summary

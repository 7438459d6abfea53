"""One tiny real training sweep (2 seeds, via the CLI in a subprocess) shared by the eval and report tests."""
import os
import subprocess
import sys

import pytest

ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
# 400 env steps in 50-step Pendulum episodes: 8 episodes a run, returns logged, a checkpoint written.
TINY = ["total_env_steps=400", "algo.learning_starts=200", "algo.batch_size=32", "algo.chunk_steps=16",
        "model.actor.hidden=[32,32]", "model.critic.hidden=[32,32]", "run.live=false", "logger=none",
        "+env.kwargs.max_episode_steps=50"]


def rlfarm(*args, cwd=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "rlfarm.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=ENV)


@pytest.fixture(scope="session")
def tiny_sweep(tmp_path_factory):
    """A multirun dir with runs 0/ (seed=1) and 1/ (seed=2), each a complete run directory."""
    root = tmp_path_factory.mktemp("sweep")
    args = ["train", "-m", "seed=1,2", f"hydra.sweep.dir={root}", "hydra.sweep.subdir=${hydra.job.num}", *TINY]
    out = rlfarm(*args, cwd=root)
    if out.returncode != 0 and "timed out during startup" in out.stderr:
        # Ray's raylet/GCS can miss its start-up deadline on a CI box whose 2 cores are busy: one more try.
        out = rlfarm(*args, cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (root / "0" / "summary.json").exists() and (root / "1" / "summary.json").exists()
    return root

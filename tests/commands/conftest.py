"""One tiny real training sweep (2 seeds, via the CLI in a subprocess) shared by the eval and report tests."""
import pytest

from helpers import TINY_SAC, rlfarm

# 400 env steps in 50-step Pendulum episodes: 8 episodes a run, returns logged, a checkpoint written.
TINY = ["total_env_steps=400", *TINY_SAC, "run.live=false", "logger=none", "+env.kwargs.max_episode_steps=50"]


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

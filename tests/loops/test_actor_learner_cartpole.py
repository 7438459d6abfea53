"""`rlfarm train algo=impala|appo`: the actor-learner through the farm's spine (runners acting with stale weights →
labelers → V-trace learner), run as a user runs it, in a subprocess: it learns CartPole, every trained-on chunk is
within the policy-lag bound, the data is accounted for exactly once, and the run resumes and plays in `rlfarm eval`."""
import json
import signal

import pytest
import torch

from helpers import metrics_rows, read_summary, rlfarm, start_train, train, wait_for

TWO_RUNNERS = ["env=cartpole", "topology.roles.env_runner.count=2", "ray.num_cpus=3", "run.live=false", "logger=none"]


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["impala", "appo"])
def test_actor_learner_learns_cartpole_to_400_within_300k_env_steps(tmp_path, algo):
    run_dir = tmp_path / algo
    out = rlfarm("train", f"algo={algo}", *TWO_RUNNERS, "total_env_steps=300000", "algo.target_return=400",
                 "algo.max_policy_lag=6", f"hydra.run.dir={run_dir}", timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = read_summary(run_dir)
    assert summary["reached_target"] and summary["env_steps"] <= 300_000, summary
    assert summary["transitions_produced"] == summary["transitions_labeled"] == summary["transitions_stored"]
    rows = metrics_rows(run_dir)
    assert rows[0]["episode_return_mean"] is None or rows[0]["episode_return_mean"] < 100  # started near chance (~22)
    lags = [row["policy_lag_max"] for row in rows if row.get("policy_lag_max") is not None]
    assert lags and max(lags) <= 6  # every chunk a batch took was within the bound ...
    assert any(row["policy_lag_mean"] > 0 for row in rows if row.get("policy_lag_mean") is not None)  # ... and stale
    # The final checkpoint plays through `rlfarm eval` (greedy actions).
    played = rlfarm("eval", f"run_dir={run_dir}", "episodes=3", "video=false", timeout=300)
    assert played.returncode == 0, played.stderr[-3000:]
    assert json.loads((run_dir / "eval" / "returns.json").read_text())["return_mean"] >= 400


def test_an_appo_run_preempted_by_sigterm_resumes_and_finishes(tmp_path):
    """SIGTERM (Slurm's preemption) → preempted.pt and exit 75 → resume=auto finishes the budget exactly once."""
    run_dir = tmp_path / "run"
    proc = start_train(run_dir, "algo=appo", *TWO_RUNNERS, "total_env_steps=60000")
    assert wait_for(lambda: len(metrics_rows(run_dir)) >= 2, 120)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode == 75 and (run_dir / "checkpoints" / "preempted.pt").exists()
    preempted = torch.load(run_dir / "checkpoints" / "preempted.pt", weights_only=True)
    assert 0 < preempted["stored"] < 60000 and preempted["updates"] > 0
    again = train(run_dir, "resume=auto")
    assert again.returncode == 0, again.stderr[-3000:]
    after = read_summary(run_dir)
    assert after["restarts"] == 1 and after["updates"] > preempted["updates"]
    assert after["env_steps"] == after["transitions_produced"] == after["transitions_stored"] == 60000

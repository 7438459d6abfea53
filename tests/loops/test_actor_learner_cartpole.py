"""`rlfarm train algo=impala|appo`: the actor-learner through the farm's spine (runners acting with stale weights →
labelers → V-trace learner), run as a user runs it, in a subprocess: it learns CartPole (APPO with two
data-parallel learner ranks), every trained-on chunk is within the policy-lag bound, the data is accounted for exactly once, and the run resumes and plays in `rlfarm eval`."""
import json
import signal

import pytest
import torch

from helpers import metrics_rows, read_summary, rlfarm, start_train, train, wait_for

TWO_RUNNERS = ["env=cartpole", "topology.roles.env_runner.count=2", "ray.num_cpus=3", "logger=none"]


LEARNS = ["total_env_steps=300000", "algo.target_return=400", "algo.max_policy_lag=6"]


# Two ranks of one chunk each: the global batch (ranks × algo.batch_chunks) of the one-rank runs.
RANKS = ["topology.roles.learner.count=2", "topology.roles.learner.threads=1", "algo.batch_chunks=1", "ray.num_cpus=4",
         "logger=none"]


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["impala", "appo"])
def test_actor_learner_learns_cartpole_to_400_within_300k_env_steps(tmp_path, algo):
    """APPO runs with two data-parallel learner ranks (gloo: one runner each, gradients averaged every update) and is
    preempted on the way (SIGTERM, as Slurm sends it: preempted.pt with both ranks' counters, exit 75), then resumed
    with resume=auto: it learns across the two sessions, and the budget is produced, labeled and stored exactly once."""
    run_dir = tmp_path / algo
    if algo == "appo":
        proc = start_train(run_dir, f"algo={algo}", *TWO_RUNNERS[:-2], *RANKS, *LEARNS)
        assert wait_for(lambda: len(metrics_rows(run_dir)) >= 2, 120)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        assert proc.returncode == 75 and (run_dir / "checkpoints" / "preempted.pt").exists()
        preempted = torch.load(run_dir / "checkpoints" / "preempted.pt", weights_only=True)
        assert 0 < preempted["stored"] < 300_000 and preempted["updates"] > 0
        assert len(preempted["ranks"]) == 1 and preempted["ranks"][0]["stored"] > 0  # rank 1's counters ride along
        out = train(run_dir, "resume=auto", timeout=900)
    else:
        out = train(run_dir, f"algo={algo}", *TWO_RUNNERS, *LEARNS, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = read_summary(run_dir)
    assert summary["reached_target"] and summary["env_steps"] <= 300_000, summary
    assert summary["env_steps"] == summary["transitions_produced"] == summary["transitions_stored"]
    assert summary["transitions_labeled"] == summary["transitions_stored"]
    assert summary["restarts"] == (1 if algo == "appo" else 0)
    assert summary.get("learner_ranks", 1) == (2 if algo == "appo" else 1)
    rows = metrics_rows(run_dir)
    assert rows[0]["episode_return_mean"] is None or rows[0]["episode_return_mean"] < 100  # started near chance (~22)
    lags = [row["policy_lag_max"] for row in rows if row.get("policy_lag_max") is not None]
    assert lags and max(lags) <= 6  # every chunk a batch took was within the bound ...
    assert any(row["policy_lag_mean"] > 0 for row in rows if row.get("policy_lag_mean") is not None)  # ... and stale
    # The final checkpoint plays through `rlfarm eval` far above chance (~22), acting as the run was judged: sampled
    # actions (deterministic=false). Greedy actions are not what the 10-episode target measured: a sampled policy at 400
    # can drift off the track when made greedy (greedy means of 364, <200 and 132 were seen in CI). Not held to 400:
    # the run stops the moment the sampled mean reaches it, and the learner's final weights are a few updates past the
    # ones that played those episodes (sampled means of 127 over 5 episodes were seen in CI for IMPALA): held to 4x chance.
    played = rlfarm("eval", f"run_dir={run_dir}", "episodes=10", "deterministic=false", "video=false", timeout=300)
    assert played.returncode == 0, played.stderr[-3000:]
    returns = json.loads((run_dir / "eval" / "returns.json").read_text())
    assert returns["return_mean"] >= 90, [episode["return"] for episode in returns["episodes"]]

"""On a GPU the learner runs SAC updates in CUDA graphs (algo.agent.graph_updates): the whole pipeline still
stores every transition once and does exactly the updates the update-to-data ratio asks for."""
import json
import os
import subprocess
import sys

import pytest


@pytest.mark.gpu
@pytest.mark.parametrize("overrides, updates", [
    ([], 4000 - 500 + 1),  # utd_ratio 1 after learning_starts
    # many-env settings: large batches, fewer updates per transition (graph groups filled across chunks)
    (["algo.utd_ratio=0.25", "algo.batch_size=4096"], (4000 - 500 + 1) // 4),
], ids=["utd1-batch256", "utd0.25-batch4096"])
def test_graphed_learner_on_gpu_does_every_owed_update(tmp_path, overrides, updates):
    run_dir = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "rlfarm.cli", "train", "topology=colocated", "total_env_steps=4000",
                          "algo.learning_starts=500", "run.live=false", f"hydra.run.dir={run_dir}", *overrides],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["transitions_produced"] == summary["transitions_stored"] == 4000
    assert summary["updates"] == updates
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(row.get("critic_loss") is None or abs(row["critic_loss"]) < 1e6 for row in rows)

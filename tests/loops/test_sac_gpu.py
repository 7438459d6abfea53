"""On a GPU the learner runs SAC updates in CUDA graphs (algo.agent.graph_updates): the whole pipeline still
stores every transition once and does exactly the updates the update-to-data ratio asks for."""
import json
import os
import subprocess
import sys

import pytest


@pytest.mark.gpu
def test_graphed_learner_on_gpu_does_every_owed_update(tmp_path):
    run_dir = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "rlfarm.cli", "train", "topology=colocated", "total_env_steps=4000",
                          "algo.learning_starts=500", "run.live=false", f"hydra.run.dir={run_dir}"],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["transitions_produced"] == summary["transitions_stored"] == 4000
    assert summary["updates"] == 4000 - 500 + 1  # utd_ratio 1 after learning_starts
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(row.get("critic_loss") is None or abs(row["critic_loss"]) < 1e6 for row in rows)

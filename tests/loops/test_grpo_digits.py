"""`rlfarm train experiment=grpo_digits`: GRPO through Ray roles (engine → scorer → learner → sync) learns to
copy 4 digits from scratch on CPU, and writes a complete run directory."""
import json
import os
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_grpo_digits_reaches_095_within_5_minutes(tmp_path):
    run_dir = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "rlfarm.cli", "train", "experiment=grpo_digits", f"hydra.run.dir={run_dir}",
                          "run.live=false"], capture_output=True, text=True, timeout=900,
                         env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["reward_mean"] >= 0.95 and summary["reached_target"], summary
    assert summary["wall_s"] <= 300
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["reward"] < 0.3  # it started near chance (~0.05)
    assert all(row["staleness"] == 0 for row in rows)  # synchronous: every rollout came from the newest weights
    assert [row["updates"] for row in rows] == list(range(1, summary["updates"] + 1))
    assert summary["samples"] == summary["updates"] * 32 * 8 and (run_dir / "checkpoints" / "final.pt").exists()
    # fp32 engine and learner on CPU, synchronous: every update starts on the engine's policy (mismatch ~0)
    assert all(0 <= row["engine_logprob_gap"] < 1e-4 for row in rows), rows[:3]


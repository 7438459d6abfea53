"""`rlfarm train experiment=simplevla`: GRPO with SimpleVLA-RL's recipe trains the tiny VLA on the SAPIEN
push-cube task through Ray roles (rollout worker + learner)."""
import json

import pytest

from helpers import rlfarm

pytest.importorskip("sapien", reason="SAPIEN is an optional extra: pip install -e .[sim]")


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_simplevla_smoke_writes_a_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    out = rlfarm("train", "experiment=simplevla", f"hydra.run.dir={run_dir}", "run.live=false", "algo.max_updates=2",
                 "algo.groups_per_update=2", "algo.group_size=4", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["updates"] == 2 and summary["samples"] == 2 * 2 * 4 and summary["pipeline"] is True
    assert 0.0 <= summary["success_rate"] <= 1.0 and summary["wall_s"] > 0
    for key in ("rollout_s", "env_s", "infer_s", "overlap_s", "update_s", "env_steps_per_s"):
        assert summary["median"][key] >= 0, key
    rows = _rows(run_dir)
    assert [row["updates"] for row in rows] == [1, 2] and rows[-1]["env_steps"] == summary["env_steps"] > 0
    assert all(row["staleness"] == 0 for row in rows)  # synchronous: every rollout used the newest weights
    assert (run_dir / "checkpoints" / "final.pt").exists()


@pytest.mark.slow
def test_tiny_vla_learns_push_cube_within_5_minutes(tmp_path):
    run_dir = tmp_path / "run"
    out = rlfarm("train", "experiment=simplevla", f"hydra.run.dir={run_dir}", "run.live=false", timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = _rows(run_dir)
    assert rows[0]["success_rate"] <= 0.2, rows[0]  # it starts as a uniformly random policy over the bins
    assert summary["success_rate"] >= 0.6 and summary["reached_target"], summary  # mean of the last 10 updates
    assert summary["wall_s"] <= 300 + 30  # run.max_wall_s stops it at 300 s; the last update may run over

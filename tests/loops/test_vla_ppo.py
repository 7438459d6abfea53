"""`rlfarm train experiment=ppo_vla`: PPO with a critic (value head on the tiny VLA's trunk, GAE over action chunks)
learns the SAPIEN push-cube task through the VLA roles, here through the batching inference server."""
import json

import pytest
import torch

from helpers import rlfarm

pytest.importorskip("sapien", reason="SAPIEN is an optional extra: pip install -e .[sim]")


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_ppo_with_a_critic_learns_push_cube_through_the_inference_server(tmp_path):
    """Two rollout workers and one server (topology=local_vla_server), the value head shared with the policy (its
    weights reach the server with every publication): success from a uniformly random start to ≥ 0.8, and the
    critic explains most of the return by then."""
    run_dir = tmp_path / "run"
    out = rlfarm("train", "experiment=ppo_vla", "topology=local_vla_server", f"hydra.run.dir={run_dir}",
                 "run.live=false", timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = _rows(run_dir)
    assert rows[0]["success_rate"] <= 0.2, rows[0]
    assert summary["reached_target"] and summary["success_rate"] >= 0.8, summary
    assert summary["samples"] == summary["updates"] * 64 and summary["inference_servers"] == 1
    assert rows[0]["explained_variance"] <= 0.0 < max(row["explained_variance"] for row in rows[-10:])
    assert all(row["staleness"] == 0 and row["server_batch_mean"] > 0 and 0 < row["server_busy"] <= 1 for row in rows)
    assert summary["rollout_workers"] == 2
    assert summary["server_decoding"] == {"dtype": "float32", "graphs": "off (the tiny VLA decodes in one pass)"}
    # each worker's call carries at most half its 32 envs: a mean above 16 means calls of both workers shared batches
    assert max(row["server_batch_mean"] for row in rows) > 16
    saved = torch.load(run_dir / "checkpoints" / "final.pt", map_location="cpu", weights_only=True)
    assert "value_head.weight" in saved["model"]

"""`rlfarm train experiment=simplevla env=maniskill_push_cube`: the VLA family on ManiSkill3's PushCube-v1 through
its camera (Vulkan: Mesa >= 23 lavapipe on CPU). A smoke run: the tiny VLA cannot learn PushCube in CI time on CPU;
the learning test stays on the physics-only SAPIEN task (test_vla_simplevla.py)."""
import json

import pytest
from omegaconf import OmegaConf

from helpers import rlfarm

pytest.importorskip("mani_skill", reason="ManiSkill3 is in the sim extra: pip install -e .[sim]")

from rlfarm.envs.maniskill_tasks import rendering_problem  # noqa: E402


@pytest.mark.slow  # ~1 min: each of the two processes compiles the renderer's shaders on lavapipe first
def test_simplevla_on_maniskill_push_cube_writes_a_run_directory(tmp_path):
    problem = rendering_problem("cpu")
    if problem:
        pytest.skip(problem)
    run_dir = tmp_path / "run"
    out = rlfarm("train", "experiment=simplevla", "env=maniskill_push_cube", f"hydra.run.dir={run_dir}",
                 "run.live=false", "algo.max_updates=2", "algo.groups_per_update=1", "algo.group_size=2",
                 "env.kwargs.max_steps=10", "env.kwargs.image_size=32", timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["updates"] == 2 and summary["samples"] == 2 * 1 * 2
    # every episode runs to its end: 10 steps unless the random policy succeeds (then fewer)
    assert 0 < summary["env_steps"] <= 2 * 2 * 10 and 0.0 <= summary["success_rate"] <= 1.0
    assert summary["median"]["env_s"] > 0 and summary["median"]["env_steps_per_s"] > 0
    assert OmegaConf.load(run_dir / "config.yaml").env.id == "PushCube-v1"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["updates"] for row in rows] == [1, 2] and rows[-1]["env_steps"] == summary["env_steps"]
    assert all(row["inference_calls"] == 2 * 2 for row in rows)  # 2 chunks of 5 per episode, in 2 env groups
    assert (run_dir / "checkpoints" / "final.pt").exists()

"""`rlfarm bench vla` on CPU: the sequential loop, one pipelined worker, a two-process farm and two Ray worker actors
sending their policy calls to one inference server (Ray started by the bench's process, shut down by it), each with
env steps/s and its inference share next to the sequential loop's, and the server's batches (a smoke test: no
timing assertions)."""
import json

import pytest

from helpers import rlfarm

pytest.importorskip("sapien", reason="the VLA bench steps SAPIEN envs: pip install -e .[sim]")


def test_bench_vla_on_cpu_compares_pipelined_and_served_rollouts_with_the_sequential_loop(tmp_path):
    # 8 envs in 4 groups of 2 (2 a worker, still double-buffered): every process builds half the scenes
    out = rlfarm("bench", "vla", "device=cpu", "bench.sizes_cpu.envs=8", "bench.sizes_cpu.group_size=2",
                 f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {row["case"]: row for row in json.loads((tmp_path / "run" / "bench.json").read_text())["rows"]}
    steps = ["sequential", "pipelined", "pipelined × 2 workers", "server × 2 workers"]
    busy = [f"{case}: inference share of wall time" for case in steps]
    served = ["server × 2 workers: mean batch", "server × 2 workers: server busy share"]
    assert set(rows) == set(steps) | set(busy) | set(served)
    for case in steps:
        row = rows[case]
        # the same workload in every case: 8 envs, one timed rollout each, 8 steps an episode at most
        assert row["envs"] == 8 and 8 <= row["env_steps"] <= 8 * 8 and row["value"] > 0
        assert row["inference_calls"] > 0 and row["env_s"] > 0 and row["infer_s"] > 0
    assert rows["pipelined × 2 workers"]["workers"] == 2 and rows["sequential"]["pipeline"] is False
    for case in steps[1:] + busy[1:]:
        assert rows[case]["ratio"] > 0
    assert rows["sequential"]["baseline"] is None and rows["pipelined"]["baseline"] == "sequential"
    # the server answered every worker's calls in batches of at most max_batch (8) observations
    batch = rows["server × 2 workers: mean batch"]
    assert 1 <= batch["value"] <= 8 and batch["batches"] > 0 and batch["largest_batch"] <= 8
    assert batch["dtype"] == "float32" and batch["graphs"] == "off"
    assert 0 < rows["server × 2 workers: server busy share"]["value"] <= 100

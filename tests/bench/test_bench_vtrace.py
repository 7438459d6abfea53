"""`rlfarm bench vtrace`: the actor-learner's update on Atari-shaped batches, one learner and two data-parallel ranks
(gloo on CPU: the same averaging path as the learner role's ranks, spawned as processes)."""
import json

from helpers import rlfarm


def test_bench_vtrace_on_cpu_writes_a_learner_row_and_a_two_rank_row(tmp_path):
    out = rlfarm("bench", "vtrace", "device=cpu", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {row["case"]: row for row in json.loads((tmp_path / "run" / "bench.json").read_text())["rows"]}
    assert set(rows) == {"fp32", "fp32 from host chunks", "2 ranks (fp32)"}  # bf16 and compile are CUDA rows
    assert rows["fp32"]["value"] > 0 and rows["fp32"]["batch"] == 16 and rows["fp32"]["unit"] == "transitions/s"
    ranks = rows["2 ranks (fp32)"]
    assert ranks["baseline"] == "fp32" and ranks["ratio"] > 0 and ranks["updates_per_s"] > 0

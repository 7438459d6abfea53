"""`rlfarm bench env`: the runner's collect path next to the raw env, in this process and with worker processes."""
import json

from helpers import rlfarm


def test_bench_env_on_cpu_writes_runner_rows_next_to_the_raw_env(tmp_path):
    """HalfCheetah (MuJoCo): runner rows per workers count, with and without batch_render."""
    out = rlfarm("bench", "env", "device=cpu", f"hydra.run.dir={tmp_path / 'run'}", "bench.actor_hidden=[16,16]",
                 "bench.sizes_cpu.envs=[halfcheetah]", "bench.sizes_cpu.num_envs=[2]",
                 "bench.sizes_cpu.workers=[0,1]", "bench.sizes_cpu.batch_render=[false,true]",
                 "bench.sizes_cpu.frame_size=16", "bench.sizes_cpu.chunk_steps=4", "bench.sizes_cpu.repeats=1",
                 cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "run" / "bench.json").read_text())
    rows = {row["case"]: row for row in result["rows"]}
    cases = {(workers, batch): f"halfcheetah x2 runner workers={workers}" + (" batch_render" if batch else "")
             for workers in (0, 1) for batch in (False, True)}
    assert set(rows) == {"halfcheetah x2 raw", *cases.values()}
    for (workers, batch), case in cases.items():
        row = rows[case]
        assert row["baseline"] == "halfcheetah x2 raw" and row["ratio"] > 0 and row["unit"] == "env steps/s"
        assert row["workers"] == workers and row["batch_render"] == batch
        assert row["num_envs"] == 2 and row["frame_size"] == 16
        assert row["act_share"] > 0 and row["step_share"] > 0 and row["render_share"] > 0
        assert abs(row["act_share"] + row["step_share"] + row["render_share"] - 1) < 0.01
    assert rows["halfcheetah x2 raw"]["value"] > 0

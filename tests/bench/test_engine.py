"""`rlfarm bench engine`: the built-in engine next to HF generate, in one run (tiny sizes on CPU)."""
import json

import pytest

from helpers import rlfarm


def test_bench_engine_on_cpu_writes_each_batch_next_to_hf_generate(tmp_path):
    out = rlfarm("bench", "engine", "device=cpu", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "run" / "bench.json").read_text())
    rows = {row["case"]: row for row in result["rows"]}
    assert result["bench"] == "engine" and result["device_name"].startswith("cpu")
    assert set(rows) == {"hf generate b2", "rlfarm engine b2", "hf generate b8", "rlfarm engine b8"}
    for batch in (2, 8):
        ours = rows[f"rlfarm engine b{batch}"]
        assert ours["baseline"] == f"hf generate b{batch}" and ours["unit"] == "tok/s"
        assert ours["ratio"] == pytest.approx(ours["value"] / rows[f"hf generate b{batch}"]["value"])
        assert ours["prefill_s"] > 0 and ours["decode_ms_per_step"] > 0

"""`rlfarm bench engine`: the built-in engine next to HF generate, and the long-tail cases (refill vs fixed batch,
the decode step vs the HBM bound, its kernel profile), in one run (tiny sizes on CPU)."""
import json

import pytest

from helpers import rlfarm


def test_bench_engine_on_cpu_writes_each_batch_next_to_hf_generate_and_the_long_tail_cases(tmp_path):
    # One timed call per figure, and the long tail's two waves of 4 slots at a cap of 16: every row still written
    # (the long-tail comparison is of counted tokens and steps, the same whatever the timing)
    out = rlfarm("bench", "engine", "device=cpu", "bench.profile=true", "bench.profile_steps=2",
                 "bench.sizes_cpu.repeats=1", "bench.sizes_cpu.long_tail.prompts=8", "bench.sizes_cpu.long_tail.cap=16",
                 f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "run" / "bench.json").read_text())
    rows = {row["case"]: row for row in result["rows"]}
    assert result["bench"] == "engine" and result["device_name"].startswith("cpu")
    assert set(rows) == {"hf generate b2", "rlfarm engine b2", "hf generate b8", "rlfarm engine b8",
                         "long-tail fixed batch", "long-tail refill", "long-tail refill prompts run again",
                         "decode step b4", "decode step b4 unfused", "decode step b4 whole row"}
    for batch in (2, 8):
        ours = rows[f"rlfarm engine b{batch}"]
        assert ours["baseline"] == f"hf generate b{batch}" and ours["unit"] == "tok/s"
        assert ours["ratio"] == pytest.approx(ours["value"] / rows[f"hf generate b{batch}"]["value"])
        assert ours["prefill_s"] > 0 and ours["decode_ms_per_step"] > 0
    fixed, refill = rows["long-tail fixed batch"], rows["long-tail refill"]
    assert refill["baseline"] == "long-tail fixed batch" and refill["unit"] == "useful tok/s"
    # the same samples, ended early
    assert refill["useful_tokens"] == fixed["useful_tokens"] < fixed["prompts"] * fixed["cap"]
    assert refill["decode_steps"] < fixed["decode_steps"] and refill["useful_frac"] > fixed["useful_frac"]
    assert "synthetic (speed run)" in refill["lengths"]
    # 8 prompts × 2 samples on 4 slots: each prompt runs once; run again, some run twice (the same samples)
    rerun = rows["long-tail refill prompts run again"]
    assert refill["prompt_forwards"] == 8 < rerun["prompt_forwards"] and refill["prompt_copies"] > 0
    assert rerun["useful_tokens"] == refill["useful_tokens"] and rerun["decode_steps"] == refill["decode_steps"]
    assert refill["vs_rerun"] == pytest.approx(refill["value"] / rerun["value"], rel=0.01)
    step, whole = rows["decode step b4"], rows["decode step b4 whole row"]
    assert step["unit"] == "ms/step" and step["value"] > 0 and step["hbm_tb_s"] == 0.05
    assert step["baseline"] == "decode step b4 whole row" and step["attended_columns"] < whole["attended_columns"]
    # beside the engine's fused q/k/v and gate/up (bench.unfused_step): the same step with a GEMM per projection
    unfused = rows["decode step b4 unfused"]
    assert step["fused_projections"] and not unfused["fused_projections"] and whole["fused_projections"]
    assert step["vs_unfused"] == pytest.approx(unfused["value"] / step["value"], rel=0.01, abs=1e-3)
    assert unfused["attended_columns"] == step["attended_columns"]
    for row in (step, unfused, whole):
        assert row["of_hbm_bound"] == pytest.approx(row["hbm_bound_ms"] / row["value"], rel=0.01, abs=1e-3)
        assert row["roofline_ms"] == max(row["hbm_bound_ms"], row["compute_bound_ms"]) <= row["serial_bound_ms"]
        assert row["of_roofline"] == pytest.approx(row["roofline_ms"] / row["value"], rel=0.01, abs=1e-3)
    profile = (tmp_path / "run" / "decode_profile.txt").read_text()
    assert step["profile"].endswith("decode_profile.txt") and "aten::mm" in profile

"""`rlfarm bench lm_learner` (issue 37): the LLM learner's update on a synthetic step, in model TFLOP/s beside a
matmul of the same run, with its tokens/s and the memory estimate (tiny sizes on CPU: MFU and peak memory need a
card)."""
import json

import pytest

from helpers import rlfarm


def test_bench_lm_learner_on_cpu_times_the_update_against_a_matmul(tmp_path):
    out = rlfarm("bench", "lm_learner", "device=cpu", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "run" / "bench.json").read_text())
    matmul, rows, tokens, packed, compiled = result["rows"]
    assert result["bench"] == "lm_learner" and matmul["case"] == "matmul n256" and matmul["value"] > 0
    assert rows["case"] == "lm update (rows)" and tokens["case"] == "lm update (tokens)"
    assert packed["case"] == "lm update (packed)" and compiled["case"] == "lm update (packed, compiled)"
    # the same step in micro-batches of 4 rows, in pieces of ≤ 48 tokens, in those packed (no padding computed), and
    # those with each decoder block compiled (aot_eager on CPU)
    for update in (rows, tokens, packed, compiled):
        assert update["baseline"] == "matmul n256" and update["unit"] == "TFLOP/s"
        assert update["ratio"] == pytest.approx(update["value"] / matmul["value"])
        # 8 rows of 8 prompt tokens and 4-16 response tokens: the padding is counted apart, not as work
        assert 8 * (8 + 4) <= update["real_tokens"] < update["padded_tokens"] == 8 * (8 + 16)
        assert update["tokens_per_s"] > 0 and update["update_s"] > 0
        assert update["mfu"] is None and update["peak_gib"] is None and update["estimate_gib"] >= 0  # no card on CPU
    assert (rows["micro_batch_size"], rows["micro_batch_tokens"]) == (4, None)
    assert (tokens["micro_batch_size"], tokens["micro_batch_tokens"]) == (None, 48)
    assert (packed["micro_batch_tokens"], packed["packed"], tokens["packed"]) == (48, True, False)
    assert packed["real_tokens"] == tokens["real_tokens"] == compiled["real_tokens"]  # the same step
    assert (compiled["packed"], compiled["compile_layers"], packed["compile_layers"]) == (True, True, False)
    # compiled in the untimed first update, once: pieces of other lengths reuse the graph (dynamic token counts)
    assert compiled["compile_s"] > 0 and compiled["compiles"] == 1 and "compile_s" not in packed
    # the timed updates compile nothing new (the warm-up compiled the blocks); no allocator on a CPU
    assert compiled["timed_compiles"] == 0 and compiled["alloc_retries"] is None

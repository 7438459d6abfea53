#!/usr/bin/env bash
# One 1-GPU device call for issue 35 item 3 (run it twice: each figure is then the median of two calls): the 7B
# decode step at batch 256 with context buckets beside the whole-row baseline and (UNFUSED=1, the default) beside
# the same step with a GEMM per projection (`decode step b256 unfused`; the default step runs q/k/v and gate/up as
# one GEMM each, rlfarm/engines/fused_projections.py; `vs_unfused` = unfused ms / fused ms), all in this one bench
# run so each ratio is within one call; their HBM bound and roofline, the long-tail refill rows (fixed batch, refill,
# and refill with every prompt run again at each fill: `vs_rerun`, the prompt donors' gain), and the fused
# step's kernel profile → $OUT/bench.json, $OUT/decode_profile.txt, $OUT/bench.log; then (TESTS=1) the engine's GPU
# tests (graphed steps and graphed refill through batch and context buckets equal eager; fused steps equal unfused
# ones and follow in-place syncs; the fused step not slower at a small shape) → $OUT/gpu_tests.log.
# Usage (device tool, carry .devpkgs): source .devpkgs/setup.sh && CUDA_VISIBLE_DEVICES=0 bash launch/device/issue35_decode.sh
# (~9 min with the tests; TESTS=0: the bench alone, BENCH=0: the tests alone, each in a call of its own).
# SWEEP=1 first times the attention kernel's launch choices and the step's GEMMs alone
# (launch/device/decode_attention_sweep.py → $OUT/decode_attention_sweep.json; AUTOTUNE=1 adds inductor's GEMMs,
# QUICK=1 only two launch choices, GEMMS=1 only the GEMMs).
set -uo pipefail
export OUT=${OUT:-/tmp/out} PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled
mkdir -p "$OUT"
run=/tmp/issue35_decode_run
rm -rf "$run"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
if [ "${SWEEP:-0}" = 1 ]; then
  timeout "${SWEEP_TIMEOUT:-240}" python3 launch/device/decode_attention_sweep.py \
    $([ "${AUTOTUNE:-0}" = 1 ] && echo --autotune) $([ "${QUICK:-0}" = 1 ] && echo --quick) \
    $([ "${GEMMS:-0}" = 1 ] && echo --gemms) > "$OUT/sweep.log" 2>&1 || echo "sweep failed: $?" | tee -a "$OUT/failed.txt"
  tail -40 "$OUT/sweep.log"
fi
if [ "${BENCH:-1}" = 1 ]; then
  timeout "${BENCH_TIMEOUT:-480}" rlfarm bench engine device=cuda bench.shape=qwen2_5_7b_shape \
    'bench.sizes.batches=[]' 'bench.sizes.static_baseline_batches=[]' bench.profile=true \
    "bench.unfused_step=$([ "${UNFUSED:-1}" = 1 ] && echo true || echo false)" \
    "bench.sizes.long_tail.prompts=${PROMPTS:-512}" "bench.sizes.long_tail.samples_per_prompt=${N:-1}" \
    hydra.run.dir="$run" > "$OUT/bench.log" 2>&1 \
    || echo "bench failed: $?" | tee -a "$OUT/failed.txt"
  cp "$run/bench.json" "$run/decode_profile.txt" "$OUT/" 2>/dev/null
  grep -E "INFO|rror" "$OUT/bench.log" | tail -15
  python3 - "$OUT/bench.json" <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["rows"]
except OSError:
    sys.exit(0)
keys = ("value", "seconds", "useful_tokens", "attended_columns", "hbm_bound_ms", "compute_bound_ms", "roofline_ms", "serial_bound_ms",
        "of_hbm_bound", "of_roofline", "speedup", "vs_matmul", "vs_unfused", "vs_rerun", "fused_projections", "ratio",
        "decode_steps", "prompt_forwards", "prompt_copies")
for row in rows:
    print(row["case"], {k: row[k] for k in keys if k in row})
PY
fi
if [ "${TESTS:-1}" = 1 ]; then
  timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -q -p no:cacheprovider -s tests/engines/test_static_decoder.py \
    tests/engines/test_fused_projections.py tests/engines/test_decode_attention.py -k "cuda or attend or written" \
    > "$OUT/gpu_tests.log" 2>&1 || echo "gpu tests: $?" | tee -a "$OUT/failed.txt"
  tail -3 "$OUT/gpu_tests.log"
  grep -h "decode step ms" "$OUT/gpu_tests.log"
fi

#!/usr/bin/env bash
# One 1-GPU device call for issue 35 item 3 (run it twice: each figure is then the median of two calls): the 7B
# decode step at batch 256 with context buckets beside the whole-row baseline (both in this one bench run, so the
# ratio is within one call), their HBM bound and roofline, the long-tail refill pair, and the step's kernel
# profile → $OUT/bench.json, $OUT/decode_profile.txt, $OUT/bench.log; then (TESTS=1) the engine's GPU tests
# (graphed steps and graphed refill through batch and context buckets equal eager) → $OUT/gpu_tests.log.
# Usage (device tool, carry .devpkgs): source .devpkgs/setup.sh && CUDA_VISIBLE_DEVICES=0 bash launch/device/issue35_decode.sh
set -uo pipefail
export OUT=${OUT:-/tmp/out} PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled
run=/tmp/issue35_decode_run
rm -rf "$run"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
timeout "${BENCH_TIMEOUT:-330}" rlfarm bench engine device=cuda bench.shape=qwen2_5_7b_shape \
  'bench.sizes.batches=[]' 'bench.sizes.static_baseline_batches=[]' bench.profile=true \
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
        "of_hbm_bound", "of_roofline", "speedup", "ratio", "decode_steps")
for row in rows:
    print(row["case"], {k: row[k] for k in keys if k in row})
PY
if [ "${TESTS:-1}" = 1 ]; then
  timeout "${TEST_TIMEOUT:-60}" python3 -m pytest -q -p no:cacheprovider tests/engines/test_static_decoder.py -k cuda \
    > "$OUT/gpu_tests.log" 2>&1 || echo "gpu tests: $?" | tee -a "$OUT/failed.txt"
  tail -3 "$OUT/gpu_tests.log"
fi

#!/usr/bin/env bash
# Issue 37's layout line on 2 GPUs (the fallback where no 4-GPU kind is lent; the 4-GPU line is split_2_2 k=1 ≥ 1.5×
# colocated_4 k=0): experiment=grpo_long_tail (1.5B shape, long-tail lengths, a speed run) in colocated_2 at k=0,
# once with each engine_capture (ahead: every CUDA graph captured again after each wake; first_use: the pairs a call
# steps, at their third step), against split_1_1 at k=1 with partial rollouts, all in this one call. Each run's
# folder under $OUT/<name>/ (llm_async.sh: summary, metrics, samples/s, GPU busy → llm_async.json, runs.tgz).
# Usage (device tool, kind nvidia-h200-x2, carry .devpkgs): source .devpkgs/setup.sh && bash launch/device/issue37_layouts_15b.sh
# First (TESTS=1) the engine's refill GPU test with both captures; first_use runs only if it passes. RUNS picks and
# orders the runs (default: "split first_use ahead"); UPDATES (8), WARM (3), RUN_TIMEOUT (200) as in llm_async.sh.
set -uo pipefail
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
log() { echo "[${SECONDS}s] $*" | tee -a "$OUT/timeline.txt"; }
run() {  # name, spec, extra overrides
  OUT="$OUT/$1" EXPERIMENT=grpo_long_tail UPDATES=${UPDATES:-8} WARM=${WARM:-3} RUN_TIMEOUT=${RUN_TIMEOUT:-200} \
    EXTRA="$3" bash launch/device/llm_async.sh "$2" > "$OUT/$1.log" 2>&1
  log "$1 ($2 $3) done"
}
runs=${RUNS:-split first_use ahead}
if [ "${TESTS:-1}" = 1 ]; then  # first_use's GPU test (graphed = eager through refill, captures, sleep and wake)
  timeout 240 python3 -m pytest -q -p no:cacheprovider tests/engines/test_static_decoder.py -k "refill and cuda" \
    > "$OUT/capture_tests.log" 2>&1
  rc=$?; log "engine capture tests rc=$rc"; tail -3 "$OUT/capture_tests.log"
  if [ $rc != 0 ]; then runs=${runs/first_use/}; log "first_use left out: its test failed"; fi
fi
for name in $runs; do
  case $name in
    ahead) run ahead colocated_2:0 "algo.engine_capture=ahead" ;;
    first_use) run first_use colocated_2:0 "algo.engine_capture=first_use" ;;
    split) run split split_1_1:1 "" ;;
  esac
done
python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
keys = ("step_s", "generate_s", "update_s", "sync_s", "step_samples_per_s", "engine_capture_s", "engine_graphs_captured",
        "partial_ratio", "staleness", "dropped_stale", "engine_busy", "learner_busy", "mfu", "updates_used")
rates = {}
for found in sorted(Path(sys.argv[1]).glob("*/llm_async.json")):
    for run, row in json.loads(found.read_text()).items():
        print(found.parent.name, run, {k: row.get(k) for k in keys} if "error" not in row else row["error"][-600:])
        rates[found.parent.name] = row.get("step_samples_per_s")
for colocated in ("ahead", "first_use"):
    if rates.get("split") and rates.get(colocated):
        print(f"split_1_1 k=1 / colocated_2 k=0 ({colocated}): {rates['split'] / rates[colocated]:.3f}")
PY
cat "$OUT/timeline.txt"
# the device tool brings back only a few files: every run's folder travels in one archive
(cd "$OUT" && tar czf layouts.tgz --exclude=layouts.tgz -- */ && rm -rf -- */)

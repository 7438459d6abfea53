#!/usr/bin/env bash
# Issue 37 on 2 GPUs (the fallback where no 4-GPU kind is lent), one device call of ~9 min:
#  1. the packed forward on this machine's torch (tests/models/test_packed.py, gpu: varlen flash in bf16 = the padded
#     masked path within bf16 noise); if it fails, the runs below go padded (algo.packed=false) and say so;
#  2. `rlfarm bench sync device=cuda bench.shape=qwen2_5_7b_shape`: a 7B publication beside a raw GPU-to-GPU copy of
#     the same bytes (the issue's ≤ 1.5x line);
#  3. experiment=grpo_7b_shape in colocated_2 (packed): step stages, MFU, peak memory (launch/device/issue37_7b.sh);
#  4. item 5 at the 1.5B shape: the first update in colocated_2 (two FSDP ranks) = split_1_1 (one rank), a GPU test.
# → $OUT/timeline.txt, $OUT/test_packed.log, $OUT/bench_sync.json, $OUT/llm_async.json, $OUT/runs.tgz, $OUT/test_15b.log
# Usage (device tool, kind nvidia-h200-x2, carry .devpkgs with the pytest wheels):
#   source .devpkgs/setup.sh && bash launch/device/issue37_x2.sh
# STEPS picks steps (default: packed sync 7b 15b, in that order).
set -uo pipefail
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
log() { echo "[${SECONDS}s] $*" | tee -a "$OUT/timeline.txt"; }
STEPS=${STEPS:-packed sync 7b 15b}
wanted() { [[ " $STEPS " == *" $1 "* ]]; }
python3 -c "import torch, inspect; from torch.nn.attention.varlen import varlen_attn; \
print(torch.__version__, inspect.signature(varlen_attn))" > "$OUT/varlen.txt" 2>&1
EXTRA=""
if wanted packed; then
  timeout 180 python3 -m pytest -q -m gpu tests/models/test_packed.py > "$OUT/test_packed.log" 2>&1
  rc=$?; log "packed gpu test rc=$rc"
  if [ $rc != 0 ]; then EXTRA="algo.packed=false"; log "the runs go padded: $EXTRA"; fi
fi
if wanted sync; then
  timeout 240 rlfarm bench sync device=cuda bench.shape=qwen2_5_7b_shape hydra.run.dir=/tmp/bench_sync \
    > "$OUT/bench_sync.log" 2>&1; log "bench sync rc=$?"
  cp /tmp/bench_sync/bench.json "$OUT/bench_sync.json" 2> /dev/null
fi
if wanted 7b; then
  UPDATES=${UPDATES:-6} WARM=${WARM:-2} RUN_TIMEOUT=${RUN_TIMEOUT:-300} EXTRA="$EXTRA" \
    bash launch/device/issue37_7b.sh colocated_2:0 > "$OUT/run_7b.log" 2>&1; log "7B run done"
fi
if wanted 15b && [ -z "$EXTRA" ]; then
  timeout 300 python3 -m pytest -q -m gpu tests/loops/test_onpolicy_data_parallel_gpu.py -k 15b > "$OUT/test_15b.log" 2>&1
  log "1.5B layouts test rc=$?"
fi
tail -3 "$OUT/test_packed.log" "$OUT/test_15b.log" 2> /dev/null; cat "$OUT/timeline.txt"

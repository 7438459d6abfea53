#!/usr/bin/env bash
# Issue 37 on one GPU: the LM learner's update alone (`rlfarm bench lm_learner`, the 1.5B shape with its own
# vocabulary: micro-batches of rows vs pieces by token budget vs the same pieces packed (algo.packed) vs those with
# each decoder block torch.compiled (algo.compile_layers, inductor: rows "lm update (rows)", "(tokens)", "(packed)",
# "(packed, compiled)" with its compile_s apart and `compiles`, the graphs dynamo made), same run; then with
# activation checkpointing), and experiment=grpo_long_tail colocated (the whole pipeline, packed: MFU, peak memory
# beside `rlfarm plan`'s estimate; EXTRA=algo.packed=false for the padded pieces). First the compiled blocks' GPU
# test (tests/models/test_compiled.py -m gpu: inductor + varlen flash in the graph = eager within bf16 noise, no
# recompile on a new length); if it fails the bench still runs, and its compiled row says what inductor does.
# → $OUT/test_compiled.log, $OUT/bench_*.json, $OUT/llm_async.json, $OUT/plan.txt, $OUT/runs.tgz
# Usage (device tool, 1 GPU, carry .devpkgs): source .devpkgs/setup.sh && bash launch/device/issue37_learner.sh
set -uo pipefail
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SHAPE=${SHAPE:-qwen2_5_1_5b_shape}
timeout 300 python3 -m pytest -q -m gpu tests/models/test_compiled.py > "$OUT/test_compiled.log" 2>&1 \
  || echo "compiled gpu test failed: $?" >> "$OUT/failed.txt"
for variant in plain:false recompute:true; do
  name=${variant%%:*}; dir=/tmp/bench_$name
  timeout 480 rlfarm bench lm_learner bench.shape="$SHAPE" bench.sizes.activation_checkpointing="${variant#*:}" \
      hydra.run.dir="$dir" > "$OUT/bench_$name.log" 2>&1 || echo "bench $name failed: $?" >> "$OUT/failed.txt"
  cp "$dir/bench.json" "$OUT/bench_$name.json" 2>/dev/null
done
rlfarm plan experiment=grpo_long_tail > "$OUT/plan.txt" 2>&1
EXPERIMENT=grpo_long_tail UPDATES=${UPDATES:-6} WARM=${WARM:-1} RUN_TIMEOUT=${RUN_TIMEOUT:-300} \
  bash launch/device/llm_async.sh colocated:0

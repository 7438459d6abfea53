#!/usr/bin/env bash
# Issue 37 on 2 GPUs (the fallback where no 4-GPU machine is lent): experiment=grpo_7b_shape in colocated_2 —
# two FSDP learner ranks of a 7B shape (its own 152k vocabulary, blocks recomputed, 16k-token pieces, the head in
# chunks) with the engine sleeping on GPU 0 while they train. `rlfarm plan` first, then the run: step stages, MFU,
# peak memory, publication time → $OUT/plan.txt, $OUT/llm_async.json, $OUT/runs.tgz. EXTRA="overrides" go to the
# plan and the runs, e.g. EXTRA="algo.activation_checkpointing=false algo.micro_batch_tokens=4096
# algo.compile_layers=true" (issue 37's MFU run: no recomputation, smaller pieces, compiled blocks).
# Usage (device tool, 2 GPUs, carry .devpkgs): source .devpkgs/setup.sh && bash launch/device/issue37_7b.sh [specs]
set -uo pipefail
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# shellcheck disable=SC2086
rlfarm plan experiment=grpo_7b_shape topology=colocated_2 ${EXTRA:-} > "$OUT/plan.txt" 2>&1
EXPERIMENT=grpo_7b_shape UPDATES=${UPDATES:-7} WARM=${WARM:-2} RUN_TIMEOUT=${RUN_TIMEOUT:-540} \
  bash launch/device/llm_async.sh "${@:-colocated_2:0}"

#!/usr/bin/env bash
# Issue 37 on 2 GPUs (the fallback where no 4-GPU machine is lent): experiment=grpo_7b_shape in colocated_2 —
# two FSDP learner ranks of a 7B shape (its own 152k vocabulary, compiled blocks without recomputation, 8k-token
# packed pieces, the head in chunks) with the engine sleeping on GPU 0 while they train. `rlfarm plan` first, then
# the run: step stages, MFU, peak memory, publication time → $OUT/plan.txt, $OUT/llm_async.json, $OUT/runs.tgz.
# EXTRA="overrides" go to the plan and the runs, e.g. EXTRA="algo.micro_batch_tokens=4096" (session 11's
# comparison), or "algo.activation_checkpointing=true algo.micro_batch_tokens=16384 algo.compile_layers=false"
# (the earlier default); NAME_TAG=_x names the run folder after its variant.
# Usage (device tool, 2 GPUs, carry .devpkgs): source .devpkgs/setup.sh && bash launch/device/issue37_7b.sh [specs]
set -uo pipefail
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# shellcheck disable=SC2086
rlfarm plan experiment=grpo_7b_shape topology=colocated_2 ${EXTRA:-} > "$OUT/plan.txt" 2>&1
EXPERIMENT=grpo_7b_shape UPDATES=${UPDATES:-7} WARM=${WARM:-2} RUN_TIMEOUT=${RUN_TIMEOUT:-540} \
  bash launch/device/llm_async.sh "${@:-colocated_2:0}"

#!/usr/bin/env bash
# Issue 35, partial rollouts on GPUs: the long-tail pair of issue35_36.sh in the regime they exist for, where a
# step's generation outlasts its update — few samples (4 prompts × 8) with a long tail (cap 4,096 tokens, median a
# third of it, synthetic lengths: a speed-run setting). The 1.5B shape, `topology=split_1_1` (learner on GPU 0,
# engine + scorer on GPU 1), k=0 then k=1 with partial rollouts (the default at k>0) → $OUT/partial.json (medians
# after WARM updates, partial_ratio, version_span, staleness) and $OUT/partial_runs.tgz.
# Usage (device tool, 2 GPUs, carry .devpkgs): source .devpkgs/setup.sh && bash launch/device/issue35_partial.sh
set -uo pipefail
export OUT=${OUT:-/tmp/out}
EXPERIMENT=grpo_long_tail UPDATES=${UPDATES:-7} WARM=${WARM:-2} RUN_TIMEOUT=${RUN_TIMEOUT:-250} \
  EXTRA="algo.prompts_per_step=4 algo.max_new_tokens=4096 algo.micro_batch_size=4 ${EXTRA:-}" \
  bash launch/device/llm_async.sh split_1_1:0 split_1_1:1
mv "$OUT/llm_async.json" "$OUT/partial.json"; mv "$OUT/runs.tgz" "$OUT/partial_runs.tgz"

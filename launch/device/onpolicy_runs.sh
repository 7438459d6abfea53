#!/usr/bin/env bash
# GRPO with the Qwen2.5-0.5B-shaped policy (bf16) on a 2-GPU machine, one run per topology: colocated (1 GPU, the
# engine sleeps while the learner trains; weights by CUDA IPC), split_1_1 (learner GPU 0, engine + scorer GPU 1;
# NCCL broadcast), colocated_2 (2 data-parallel learner ranks). Summaries, metrics and logs → $OUT/<topology>/.
# Usage (device tool, carry .devpkgs): source .devpkgs/setup.sh && bash launch/device/onpolicy_runs.sh [updates] [topology...]
set -uo pipefail
UPDATES=${1:-8}; shift || true
TOPOLOGIES=${*:-colocated split_1_1 colocated_2}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
for topology in $TOPOLOGIES; do
  dir=/tmp/onpolicy_$topology
  mkdir -p "$OUT/$topology"
  timeout 150 rlfarm train experiment=grpo_qwen05b_shape topology=$topology algo.max_updates=$UPDATES algo.target_reward=null \
      run.live=false hydra.run.dir=$dir > "$OUT/$topology/stdout.log" 2>&1 || echo "$topology failed: $?" >> "$OUT/failed.txt"
  cp $dir/summary.json $dir/metrics.jsonl $dir/train.log "$OUT/$topology/" 2>/dev/null || true
done

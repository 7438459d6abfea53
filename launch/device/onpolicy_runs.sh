#!/usr/bin/env bash
# GRPO with the Qwen2.5-0.5B-shaped policy on a 2-GPU machine: one run colocated (1 GPU, the engine sleeps while
# the learner trains) and one split_1_1 (learner GPU 0, engine + scorer GPU 1). Summaries and metrics → $OUT.
# Usage (device tool, carry .devpkgs): source .devpkgs/setup.sh && bash launch/device/onpolicy_runs.sh [updates]
set -euo pipefail
UPDATES=${1:-8}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpus.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" > "$OUT/versions.txt"
for topology in colocated split_1_1; do
  dir=/tmp/onpolicy_$topology
  rlfarm train experiment=grpo_qwen05b_shape topology=$topology algo.max_updates=$UPDATES algo.target_reward=null \
      run.live=false hydra.run.dir=$dir > "$OUT/$topology.log" 2>&1 || echo "$topology failed: $?" >> "$OUT/failed.txt"
  mkdir -p "$OUT/$topology"
  cp $dir/summary.json $dir/metrics.jsonl $dir/train.log "$OUT/$topology/" 2>/dev/null || true
done

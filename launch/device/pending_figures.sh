#!/usr/bin/env bash
# The GPU figures still owed (issues 3, 4), in one device call on the 2-GPU kind, carrying .devpkgs:
#   source .devpkgs/setup.sh && bash launch/device/pending_figures.sh
# then, within 30 s on the still-warm machine, carrying .simwhl: bash launch/device/vla_bench.sh (issue 7).
# Everything lands in $OUT: bench_sync.json (+ NCCL logs), and per on-policy run summary/metrics/train.log.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi -L > "$OUT/gpus.txt"; nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
python3 -c "import torch, transformers; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version(), 'transformers', transformers.__version__)" > "$OUT/versions.txt"

# P5: learner → engine weight sync, bf16 0.5B shape, next to a raw GPU 0 → GPU 1 copy of the same bytes
NCCL_DEBUG=INFO NCCL_DEBUG_FILE="$OUT/nccl.%p.log" timeout 150 rlfarm bench sync device=cuda hydra.run.dir=/tmp/bench_sync \
  > "$OUT/bench_sync.log" 2>&1; echo "exit $?" >> "$OUT/bench_sync.log"
cp /tmp/bench_sync/bench.json "$OUT/bench_sync.json" 2>/dev/null

# Issue 3: the 0.5B-shaped GRPO experiment (bf16) colocated on one GPU, split_1_1, and 2 data-parallel ranks
for topology in colocated split_1_1 colocated_2; do
  dir=/tmp/onpolicy_$topology
  timeout 140 rlfarm train experiment=grpo_qwen05b_shape topology=$topology algo.max_updates=6 algo.target_reward=null \
      run.live=false hydra.run.dir=$dir > "$OUT/$topology.log" 2>&1 || echo "$topology failed: $?" >> "$OUT/failed.txt"
  mkdir -p "$OUT/$topology"; cp $dir/summary.json $dir/metrics.jsonl $dir/train.log "$OUT/$topology/" 2>/dev/null
done

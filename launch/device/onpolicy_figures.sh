#!/usr/bin/env bash
# The on-policy GPU figures (issues 3, 4) in one device call on the 2-GPU kind, carrying .devpkgs:
#   source .devpkgs/setup.sh && bash launch/device/onpolicy_figures.sh
# The GPU tests of weight sync (CUDA IPC, NCCL), the sync bench (P5, NCCL logs kept), then the 0.5B-shaped GRPO runs
# (launch/device/onpolicy_runs.sh). The device tool brings back only a few files: everything is packed into
# $OUT/figures.tgz (plus bench_sync.json alone).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/figures"
F=$OUT/figures
nvidia-smi -L > "$F/gpus.txt"; nvidia-smi topo -m > "$F/topo.txt" 2>&1
python3 -c "import torch, transformers; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version(), 'transformers', transformers.__version__)" > "$F/versions.txt"

timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/sync/test_ipc.py tests/sync/test_broadcast.py \
  > "$F/gpu_tests.log" 2>&1; echo "exit $?" >> "$F/gpu_tests.log"

# P5: learner → engine weight sync, bf16 0.5B shape, next to a raw GPU 0 → GPU 1 copy of the same bytes
NCCL_DEBUG=INFO NCCL_DEBUG_FILE="$F/nccl.%p.log" timeout 150 rlfarm bench sync device=cuda hydra.run.dir=/tmp/bench_sync \
  > "$F/bench_sync.log" 2>&1; echo "exit $?" >> "$F/bench_sync.log"
cp /tmp/bench_sync/bench.json "$OUT/bench_sync.json" 2>/dev/null

OUT=$F bash launch/device/onpolicy_runs.sh "${UPDATES:-6}"
tar czf "$OUT/figures.tgz" -C "$OUT" figures && rm -rf "$F"

#!/bin/bash
# Issue 15 GPU checks (carry .devpkgs with the pytest wheels, and .gl): the gpu-marked learner/buffer tests, then
# `rlfarm bench learner` (HalfCheetah sizes; eager, graph, the learner role's own bursts, then its loop beside chunk ingest and
# 12 EGL renderers on its GPU: rlfarm/bench/learner_beside.py) at batch 256 and $BATCH.
set -uo pipefail
source launch/device/gpu_env.sh
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/roles/test_sac_learner.py tests/buffers/test_replay.py \
  tests/bench/test_learner.py tests/loops/test_sac_gpu.py 2>&1 | tail -15
for batch in 256 ${BATCH:-1024}; do
  CUDA_VISIBLE_DEVICES=0 timeout 300 rlfarm bench learner device=cuda bench.sizes.profile=false '~bench.cases.pendulum' \
    bench.sizes.batch_size=$batch hydra.run.dir=/tmp/bench_$batch > /tmp/bench_$batch.log 2>&1
  echo "bench batch $batch rc=$?"; tail -8 /tmp/bench_$batch.log | cut -c1-200
  cp /tmp/bench_$batch/bench.json "$OUT/bench_learner_$batch.json"
done

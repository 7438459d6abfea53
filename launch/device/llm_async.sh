#!/usr/bin/env bash
# Issue 16's GPU figures: `experiment=$EXPERIMENT` (default grpo_qwen05b_shape; issue 35: grpo_long_tail) once per
# TOPOLOGY:K (algo.max_staleness=K), GPU utilisation sampled every 200 ms; each run's summary, metrics, log and
# samples → $OUT/<topology>_k<K>/, and launch/device/llm_collect.py condenses them into $OUT/llm_async.json (medians after WARM updates).
# Usage (device tool, carry .devpkgs): source .devpkgs/setup.sh && UPDATES=30 bash launch/device/llm_async.sh \
#   split_1_1:0 split_1_1:1 colocated_4:0 split_2_2:0 split_2_2:1      [EXTRA="more overrides"]
set -uo pipefail
OUT=${OUT:-/tmp/out}; UPDATES=${UPDATES:-30}; EXTRA=${EXTRA:-}; EXPERIMENT=${EXPERIMENT:-grpo_qwen05b_shape}
NAME_TAG=${NAME_TAG:-}   # suffix of the run folders (e.g. _nofilter for an EXTRA variant)
mkdir -p "$OUT"
nvidia-smi -L > "$OUT/gpus.txt"; nproc >> "$OUT/gpus.txt"
for spec in "$@"; do
  topology=${spec%%:*}; k=${spec#*:}; name=${topology}_k$k$NAME_TAG; dir=/tmp/llm_$name
  rm -rf "$dir"; mkdir -p "$OUT/$name"
  nvidia-smi --query-gpu=timestamp,index,utilization.gpu --format=csv,noheader,nounits -lms 200 > "$OUT/$name/gpu.csv" &
  sampler=$!
  # shellcheck disable=SC2086
  timeout "${RUN_TIMEOUT:-150}" rlfarm train experiment="$EXPERIMENT" topology="$topology" algo.max_staleness="$k" \
      algo.max_updates="$UPDATES" algo.target_reward=null run.live=false run.checkpoint=false hydra.run.dir="$dir" \
      $EXTRA > "$OUT/$name/stdout.log" 2>&1 || echo "$name failed: $?" >> "$OUT/failed.txt"
  kill "$sampler"
  cp "$dir"/summary.json "$dir"/metrics.jsonl "$dir"/train.log "$OUT/$name/" 2>/dev/null
done
python3 launch/device/llm_collect.py "$OUT" > "$OUT/llm_async.json"; cat "$OUT/llm_async.json"
# the device tool brings back only a few files: the run folders travel as one archive
(cd "$OUT" && tar czf runs.tgz --exclude=runs.tgz -- */ && rm -rf -- */)

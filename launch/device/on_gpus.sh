#!/usr/bin/env bash
# Run one command per GPU of a device machine at once, each seeing only its GPU, each writing under $OUT/g<i>:
#   bash launch/device/on_gpus.sh 'CMD for GPU 0' 'CMD for GPU 1' ...
# Sets the staged packages up first (.devpkgs/setup.sh, carry .devpkgs), in this shell, before any command starts:
# written inline as `source setup.sh && (A) & B`, bash backgrounds `source && A` as one list, so B starts at once
# without the set-up, and a `mkdir` inside that list may not have run yet (session 10 lost two GPU-halves of
# calls to it). Each command runs as `bash -c` with CUDA_VISIBLE_DEVICES=i and OUT=$OUT/g<i>; its output goes to
# $OUT/g<i>/run.log, whose tail is printed when all have ended. Exit status: how many commands failed.
set -uo pipefail
if [ $# -eq 0 ]; then
  echo "usage: bash launch/device/on_gpus.sh 'CMD for GPU 0' ['CMD for GPU 1' ...]" >&2
  exit 2
fi
if [ -f .devpkgs/setup.sh ]; then
  source .devpkgs/setup.sh
fi
export OUT=${OUT:-/tmp/out}
pids=()
for i in $(seq 0 $(($# - 1))); do
  mkdir -p "$OUT/g$i"
  command=${*:$((i + 1)):1}
  CUDA_VISIBLE_DEVICES=$i OUT="$OUT/g$i" bash -c "$command" > "$OUT/g$i/run.log" 2>&1 &
  pids+=($!)
done
failed=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { echo "GPU $i: exit $?"; failed=$((failed + 1)); }
done
for i in "${!pids[@]}"; do
  echo "== GPU $i: ${*:$((i + 1)):1}"
  tail -"${TAIL:-20}" "$OUT/g$i/run.log"
done
exit "$failed"

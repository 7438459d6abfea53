#!/usr/bin/env bash
# One 2-GPU device call for issues 35 and 36 (run it twice: each figure is then the median of two calls):
#  1. issue 35's acceptance pair: `experiment=grpo_long_tail topology=split_1_1` (1.5B shape, 256 samples a step,
#     synthetic long-tail lengths up to 1,024 tokens) at k=0 and at k=1 with partial rollouts → $OUT/long_tail.json
#     (medians after WARM updates, partial_ratio and staleness per run) and $OUT/long_tail_runs.tgz;
#  2. issue 36's judge farm after the labeler bus fix: `rlfarm bench labeler bench.reward=vlm_judge` at the ~2B
#     shape on GPU 0 (direct batched call, inline, the farm of 2 labelers, the default 30 s window) → $OUT/judge/;
#  3. beside it on GPU 1 (FILTER=1): issue 35 item 5, `experiment=grpo_qwen05b_shape topology=colocated` with and
#     without `algo.filter_groups` → $OUT/filter/ (per-update update_s against kept_groups in its runs.tgz).
# Usage (device tool, carry .devpkgs): source .devpkgs/setup.sh && bash launch/device/issue35_36.sh
set -uo pipefail
export OUT=${OUT:-/tmp/out}
EXPERIMENT=grpo_long_tail UPDATES=${UPDATES:-8} WARM=${WARM:-3} RUN_TIMEOUT=${RUN_TIMEOUT:-220} \
  bash launch/device/llm_async.sh split_1_1:0 split_1_1:1
mv "$OUT/llm_async.json" "$OUT/long_tail.json"; mv "$OUT/runs.tgz" "$OUT/long_tail_runs.tgz"
if [ "${FILTER:-0}" = 1 ]; then
  ( top=$OUT; export OUT=$top/filter CUDA_VISIBLE_DEVICES=1 UPDATES=30 WARM=5 RUN_TIMEOUT=200
    bash launch/device/llm_async.sh colocated:0 > /dev/null 2>&1
    mv "$OUT/runs.tgz" "$top/filter_on.tgz"; mv "$OUT/llm_async.json" "$top/filter_on.json"
    NAME_TAG=_nofilter EXTRA="algo.filter_groups=false" bash launch/device/llm_async.sh colocated:0 > /dev/null 2>&1
    mv "$OUT/runs.tgz" "$top/filter_off.tgz"; mv "$OUT/llm_async.json" "$top/filter_off.json" ) &
  filter=$!
fi
CUDA_VISIBLE_DEVICES=0 timeout "${JUDGE_TIMEOUT:-140}" rlfarm bench labeler device=cuda bench.reward=vlm_judge \
  "bench.judge.shapes=[${JUDGE_SHAPE:-qwen2-vl-2b_shape}]" bench.judge.inline_frames=4 hydra.run.dir="$OUT/judge" \
  > "$OUT/judge.log" 2>&1 || echo "judge failed: $?" >> "$OUT/failed.txt"
tail -25 "$OUT/judge.log"
[ -n "${filter:-}" ] && wait "$filter" && cat "$OUT"/filter_*.json

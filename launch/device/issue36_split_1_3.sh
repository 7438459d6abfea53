#!/bin/bash
# Issue 36's acceptance as the issue states it, on a 4-GPU machine: topology=split_1_3 (the learner on GPU 0, six
# labelers two per GPU on GPUs 1-3, every runner rendering on GPUs 1-3 by the default layout), the issue's sizes:
# 48 runners x 4 sub-envs, UTD 0.25, batch 1,024, 224-px frames; the judge with 24 runners. The same script as the
# 2-GPU fallback (launch/device/issue36_split_1_1.sh: its RUNS, WALL, HARD, ...), each ratio against the reward
# model's direct call on GPU 1 times three (the farm's ceiling on three GPUs) and the learner's bench, from the same
# call. Plan two calls of <= 10 min, each run twice for medians, e.g.
#   RUNS="env_frames clip_bf16 clip_fp8" WALL=40 HARD=540        (lines a and b)
#   RUNS="judge_mps clip_mps clip_mps_r0" WALL=40 JUDGE_WALL=60 HARD=540   (line c; the farm beside its renderers)
# Usage (device tool, kind nvidia-h200-x4; carry .devpkgs and .gl): source .devpkgs/setup.sh && \
#   RUNS="..." bash launch/device/issue36_split_1_3.sh
export TOPOLOGY=split_1_3 RUNNERS=${RUNNERS:-48} NUM_ENVS=${NUM_ENVS:-4} UTD=${UTD:-0.25} \
  JUDGE_RUNNERS=${JUDGE_RUNNERS:-24}
exec bash "$(dirname "$0")/issue36_split_1_1.sh" "$@"

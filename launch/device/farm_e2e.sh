#!/bin/bash
# Issue 15: the labeling farm end to end on a 2- or 4-GPU machine (HalfCheetah, frames rendered by the runners).
#   farm_e2e.sh learner   the learner inside the pipeline with the env reward (learner-limited: UTD 1, batch 256,
#                         many runners); its bench figure alone comes from gpu_checks.sh
#   farm_e2e.sh farm      reward=env with frames rendered but unused, then reward=clip (ViT-L/14 shape, 224 px),
#                         same runners/batch/UTD, $WALL s each; RUNS may also name clip_fp8 (reward.precision=fp8)
#                         and judge (reward=vlm_judge at the $JUDGE shape, default qwen2-vl-2b_shape)
# A compiled reward tower compiles while its labeler starts (run.restart_timeout_s=300 leaves room for ViT-L/14).
# Env: TOPO (split_1_1 on 2 GPUs, split_1_3 on 4), RUNNERS, NUM_ENVS, WORKERS, UTD, BATCH, WALL, LABELERS, RUNS, TAG, EXTRA;
# PROFILE_AT=<s>: that many seconds after the run's first update (past the learner's capture and compile, which take
# 20+ s under load), py-spy (a wheel staged into .devpkgs/whl) samples every labeler, the learner and one runner for
# 20 s, idle time included, into $OUT/<run>_<role>_<pid>.txt (collapsed stacks: where the wall time goes).
set -uo pipefail
PHASE=${1:-farm}
source launch/device/gpu_env.sh
NGPU=$(nvidia-smi -L | wc -l)
TOPO=${TOPO:-$([ "$NGPU" -ge 4 ] && echo split_1_3 || echo split_1_1)}
LABELERS=${LABELERS:-$(( (NGPU - 1) * 2 ))}
LABELER_GPUS=$(python3 -c "print(int(($NGPU - 1) * 100 / $LABELERS) / 100)")  # the reward GPUs shared evenly
RUNNERS=${RUNNERS:-16}; NUM_ENVS=${NUM_ENVS:-8}; WORKERS=${WORKERS:-0}; UTD=${UTD:-0.25}; BATCH=${BATCH:-1024}
WALL=${WALL:-150}
TAG=${TAG:-}   # suffix of the run names (e.g. _batch_render)
read -r -a EXTRA <<< "${EXTRA:-}"   # more overrides for the farm runs, e.g. EXTRA="env.batch_render=true"
nvidia-smi -L > "$OUT/gpus.txt"; nproc >> "$OUT/gpus.txt"
sample_gpus() { nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader,nounits -l 1 > "$1" & echo $!; }
train() {  # name, overrides...
  local name=$1; shift
  local pid; pid=$(sample_gpus /tmp/gpu_$name.csv)
  local profiler=""; [ -n "${PROFILE_AT:-}" ] && { profile "$name" & profiler=$!; }
  timeout $((WALL + 150)) rlfarm train topology=$TOPO env=halfcheetah run.live=false total_env_steps=100000000 \
    topology.roles.labeler.count=$LABELERS topology.roles.labeler.gpus=$LABELER_GPUS run.restart_timeout_s=300 \
    run.max_wall_s=$WALL hydra.run.dir=/tmp/$name "$@" > /tmp/$name.log 2>&1
  echo "$name rc=$?"; kill "$pid"; [ -n "$profiler" ] && kill "$profiler" 2>/dev/null; tail -3 /tmp/$name.log | cut -c1-400
  python3 launch/device/collect.py main /tmp/$name /tmp/gpu_$name.csv > "$OUT/$name.json"
}
profile() {  # name: py-spy the labelers, the learner and one runner of the run in progress
  for _ in $(seq 300); do  # until a metrics row shows updates/s > 0
    grep -Eq '"updates_per_s": ([1-9]|0\.[0-9]*[1-9])' "/tmp/$1/metrics.jsonl" 2>/dev/null && break
    sleep 1
  done
  sleep "$PROFILE_AT"
  [ -f "/tmp/$1/summary.json" ] && return  # the run is over: nothing of it left to sample
  for role in Labeler EnvRunner SACLearner; do
    for p in $(pgrep -f "ray::$role" | head -$([ $role = Labeler ] && echo 8 || echo 1)); do
      py-spy record --idle --format raw -r 200 -d 20 -p "$p" -o "$OUT/${1}_${role}_$p.txt" > /dev/null 2>&1 &
    done
  done
  wait
}
FARM=(topology.roles.env_runner.count=$RUNNERS env.num_envs=$NUM_ENVS env.workers=$WORKERS
      algo.utd_ratio=$UTD algo.batch_size=$BATCH labeler.bus_items=1024 labeler.bus_timeout_s=0.2)
if [ "$PHASE" = learner ]; then  # the learner alone: gpu_checks.sh (rlfarm bench learner)
  train learner_in_pipeline reward=env topology.roles.env_runner.count=$RUNNERS env.num_envs=$NUM_ENVS
else
  CLIP=/tmp/clip-l14
  [ -d $CLIP ] || python3 -m rlfarm.rewards.clip_factory --shape vit-l-14 --out $CLIP > /dev/null 2>&1
  for run in ${RUNS:-env_frames clip}; do  # RUNS="clip env_frames" takes the CLIP run first
    case $run in
      env_frames) train env_frames$TAG reward=env reward.frame_size=224 "${FARM[@]}" "${EXTRA[@]}" ;;
      clip) train clip$TAG reward=clip reward.model=$CLIP reward.compile=true reward.frame_size=224 "${FARM[@]}" "${EXTRA[@]}" ;;
      clip_fp8) train clip_fp8$TAG reward=clip reward.model=$CLIP reward.precision=fp8 reward.frame_size=224 "${FARM[@]}" "${EXTRA[@]}" ;;
      judge) train judge$TAG reward=vlm_judge reward.model=${JUDGE:-qwen2-vl-2b_shape} reward.frame_size=224 "${FARM[@]}" "${EXTRA[@]}" ;;
    esac
  done
fi
cp /tmp/*.log "$OUT/" 2>/dev/null

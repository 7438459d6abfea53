#!/bin/bash
# Issue 36's acceptance on 2 GPUs (no 4-GPU kind was lent): topology=split_1_1, the learner on GPU 0, two labelers
# and (the default layout, no env.render_gpus) every runner's EGL rendering on GPU 1; HalfCheetah, 224-px frames.
# One device call of ~7.5 min; run it twice, so that each figure is the median of two calls.
#  1. side by side: `rlfarm bench learner` on GPU 0 (the role's bursts at the runs' batch) and, on GPU 1, the reward
#     models' direct batched calls (launch/device/ceilings.py: CLIP ViT-L/14 bf16 and fp8, the ~2B judge; their
#     compiles on 8 threads each, so that the learner's bench keeps free cores);
#  2. one after another ($RUNNERS runners x $NUM_ENVS sub-envs, UTD $UTD, batch $BATCH, $WALL s of acting each;
#     launch/device/collect.py takes the rates from 10 s after the first update, the judge's from 10 s after its
#     first labels, to run.max_wall_s):
#     reward=env with frames rendered and unused, reward=clip (bf16), reward=clip reward.precision=fp8, reward=clip
#     topology.mps=true (clip_mps: the run's own MPS daemon, rlfarm/mps.py), and reward=vlm_judge at the ~2B shape
#     ($JUDGE_RUNNERS runners: it labels a few hundred frames/s, and fewer chunks in flight drain within the
#     wind-down, so that produced = labeled = stored is a fair check); while each CLIP run acts, py-spy samples its
#     labelers for $PROFILE_S s (launch/device/pyspy_top.py condenses the stacks into $W/pyspy_<run>.json);
#  3. launch/device/collect.py issue36 → $OUT/issue36.json (every figure; each acceptance ratio beside its baseline
#     from this call), rewritten after each step; the logs' tails and the plan → $OUT/logs.txt.
# UTD 0.75: the learner is then the pipeline's limit (~2,900 updates/s need ~3,900 env steps/s, which 24 runners
# exceed; at UTD 0.25 it would need ~11,600, which a 32-core machine's runners do not reach, and its speed could not
# be judged), and one reward GPU is asked for as many frames per update as each of split_1_3's three at UTD 0.25.
# Usage (device tool, kind nvidia-h200-x2; carry .devpkgs, whose wheels include mujoco, glfw and pyopengl, and .gl,
# the GL libraries' .deb files):
#   source .devpkgs/setup.sh && bash launch/device/issue36_split_1_1.sh
# RUNS picks runs and their order (default: env_frames clip_bf16 clip_fp8 judge; also clip_mps, judge_mps
# (topology.mps=true), clip_mps_r0 (clip_mps rendering on the learner's GPU 0) and distilled (reward=distilled, item 5)); each reward run brings its own ceiling (the MPS runs
# and distilled their plain model's); the learner's bench runs beside the ceilings. TESTS=1 first runs the MPS GPU test (tests/test_mps.py).
# DEVICE=cpu: a dry run of every command at tiny sizes on a CPU machine (GPUs declared to Ray, tiny models).
set -uo pipefail
OUT=${OUT:-/tmp/out}; W=${WORK:-/tmp/i36}; GL=${GL:-.gl}; WHL=${WHL:-.devpkgs/whl}; DEVICE=${DEVICE:-cuda}
# TOPOLOGY: split_1_1 (the default, the 2-GPU fallback) or split_1_3 (the issue's own layout, through
# launch/device/issue36_split_1_3.sh, which sets its sizes); the farm's ceiling is the per-GPU direct call times the
# reward GPUs (collect.py reads $W/reward_gpus)
TOPOLOGY=${TOPOLOGY:-split_1_1}; REWARD_GPUS=${REWARD_GPUS:-$([ "$TOPOLOGY" = split_1_3 ] && echo 3 || echo 1)}
RUNNERS=${RUNNERS:-24}; JUDGE_RUNNERS=${JUDGE_RUNNERS:-8}; NUM_ENVS=${NUM_ENVS:-4}; UTD=${UTD:-0.75}
BATCH=${BATCH:-1024}; WALL=${WALL:-35}; JUDGE=${JUDGE:-qwen2-vl-2b_shape}
# 90 s: a cold machine's first learner update compiles for ~25 s of the judge's run (a 45-s run gave 0.31x, no figure)
JUDGE_WALL=${JUDGE_WALL:-90}; PROFILE_S=${PROFILE_S:-12}
# the CLIP runs' UTD: 0.25 (the issue's own) leaves the learner room, so the labelers set the pace and the "labelers vs
# the bare tower" line can be judged; at 0.75 (UTD, the learner line's setting) the learner bounded the CLIP runs
CLIP_UTD=${CLIP_UTD:-0.25}
# the CLIP runs' runners x sub-envs: each runner is one EGL context on the reward GPU, time-sliced with the labelers'
# CUDA contexts (2026-11-30: 24 x 4 left the labelers waiting on that GPU 95 % of their time), so fewer runners with
# more sub-envs each (e.g. 12 x 8: the same envs) leave the labelers more of it
CLIP_RUNNERS=${CLIP_RUNNERS:-$RUNNERS}; CLIP_ENVS=${CLIP_ENVS:-$NUM_ENVS}
EXTRA=${EXTRA:-}  # more overrides for every run, e.g. EXTRA=topology.roles.labeler.count=1 (one labeler per reward GPU)
HARD=${HARD:-540}   # seconds into the call by which every run must have ended (the device call's limit less the rest)
rm -rf "$W"; mkdir -p "$OUT" "$W/runs" "$W/sync"
echo "$REWARD_GPUS" > "$W/reward_gpus"
log() { echo "[${SECONDS}s] $*" | tee -a "$W/timeline.txt"; }

for f in "$GL"/*.deb; do [ -f "$f" ] && dpkg -x "$f" /; done; [ -d "$GL" ] && ldconfig
if [ -d "$WHL" ] && ! python3 -c "import mujoco" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHL"/*.whl
fi
export MUJOCO_GL=egl PYOPENGL_PLATFORM=egl
[ -f /usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json ] && \
  export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
has_smi() { command -v nvidia-smi > /dev/null; }
has_smi && nvidia-smi -L > "$W/gpus.txt"; nproc >> "$W/gpus.txt"

if [ "$DEVICE" = cpu ]; then  # tiny everything; Ray told of the topology's GPUs so that it places
  CLIP_SHAPE=tiny; JUDGE=tiny_shape; RUNS=${RUNS:-env_frames clip_bf16 judge}; SIZE=(ray.num_gpus=$((REWARD_GPUS + 1)) ray.num_cpus=${CPUS:-8})
  FRAME=48
else
  CLIP_SHAPE=vit-l-14; RUNS=${RUNS:-env_frames clip_bf16 clip_fp8 judge}; SIZE=(); FRAME=224
fi
wanted() { [[ " $RUNS " == *" $1 "* ]]; }
needs_case() {  # the ceiling a run is compared with: clip_mps(_r0) clip_bf16's, judge_mps and distilled the judge's
  wanted $1 || { [ $1 = clip_bf16 ] && { wanted clip_mps || wanted clip_mps_r0; }; } \
    || { [ $1 = judge ] && { wanted judge_mps || wanted distilled; }; }
}
CASES=$(for case in clip_bf16 clip_fp8 judge; do needs_case $case && echo $case; done)
CLIP=/tmp/clip-$CLIP_SHAPE
collect() { python3 launch/device/collect.py issue36 "$W" > "$OUT/issue36.json.tmp" && mv "$OUT/issue36.json.tmp" "$OUT/issue36.json"; }
logs() {  # the plan, the timeline and every log's tail, in one file
  { cat "$W/gpus.txt" "$W/timeline.txt" "$W/plan.txt" 2>/dev/null
    for f in "$W"/*.log "$W"/runs/*/train.log; do [ -f "$f" ] && { echo "== $f"; tail -n "${TAIL:-12}" "$f" | cut -c1-500; }; done
    [ -f "$W/placement.txt" ] && { echo "== nvidia-smi during env_frames"; cat "$W/placement.txt"; }
  } > "$OUT/logs.txt" 2>&1
  cp "$W"/pyspy_*.json "$OUT"/ 2> /dev/null || true
}

if [ "${TESTS:-0}" = 1 ]; then
  log "MPS GPU test"; timeout 120 python3 -m pytest -q -m gpu tests/test_mps.py > "$W/test_mps.log" 2>&1; log "test_mps rc=$?"
fi

# 1. the learner's bench on GPU 0 beside the reward models' direct calls on GPU 1
log "bench learner (GPU 0) and reward ceilings (GPU 1)"
bench_learner=""
if [ -n "$RUNS" ]; then  # every run's learner: its first update then finds inductor's cache warm (a cold compile took
                         # ~25 s of a 35-s run, 2026-11-30), and the learner line's baseline
  CUDA_VISIBLE_DEVICES=0 timeout 240 rlfarm bench learner device=$DEVICE '~bench.cases.pendulum' 'bench.sizes.fast=[]' \
    bench.sizes.profile=false bench.sizes.beside=null bench.sizes.batch_size=$BATCH hydra.run.dir="$W/bench_learner" \
    > "$W/bench_learner.log" 2>&1 &
  bench_learner=$!
fi
wanted clip_bf16 || wanted clip_fp8 || wanted clip_mps || wanted clip_mps_r0 || CLIP=/nonexistent
[ -d "$CLIP" ] || [ "$CLIP" = /nonexistent ] || python3 -m rlfarm.rewards.clip_factory --shape $CLIP_SHAPE --out "$CLIP" > "$W/clip_factory.log" 2>&1
log "clip model saved"
echo "$CASES" | wc -w > "$W/sync/PEERS"
ceilings=()
for case in $CASES; do
  CUDA_VISIBLE_DEVICES=1 TORCHINDUCTOR_COMPILE_THREADS=8 timeout 240 python3 launch/device/ceilings.py $case "$CLIP" $JUDGE "$W/sync" $DEVICE \
    > "$W/ceiling_$case.json" 2> "$W/ceiling_$case.log" &
  ceilings+=($!)
done
rlfarm plan topology=$TOPOLOGY env=halfcheetah reward=env reward.frame_size=$FRAME "${SIZE[@]}" > "$W/plan.txt" 2>&1
wait "${ceilings[@]}"; log "ceilings done: $(cat "$W"/ceiling_*.json | cut -c1-120 | tr '\n' ' ')"
[ -n "$bench_learner" ] && { wait $bench_learner; log "bench learner rc=$?"; }
collect; logs

# 2. the runs, one after another
train() {  # name, seconds of acting, seconds its start-up may take at most, overrides...
  local name=$1 wall=$2 startup=$3; shift 3
  wanted "$name" || return 0
  local limit=$((startup + wall + 40)) left=$((HARD - SECONDS))
  if (( left < wall + 40 )); then log "$name skipped: ${left} s left"; return; fi
  (( limit > left )) && limit=$left
  local sampler=""
  if has_smi; then
    nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader,nounits -l 1 \
      > "$W/gpu_$name.csv" & sampler=$!
  fi
  log "$name starts (limit ${limit} s)"
  local spy=""; [[ $name == clip* ]] && { profile_labelers "$name" & spy=$!; }
  timeout $limit rlfarm train topology=$TOPOLOGY env=halfcheetah run.live=false run.checkpoint=false \
    total_env_steps=100000000 env.num_envs=${RUN_ENVS:-$NUM_ENVS} algo.utd_ratio=${RUN_UTD:-$UTD} algo.batch_size=$BATCH \
    labeler.bus_timeout_s=0.2 run.restart_timeout_s=300 run.max_wall_s=$wall ${FRAME_KEY:-reward.frame_size}=$FRAME \
    hydra.run.dir="$W/runs/$name" "${SIZE[@]}" "$@" $EXTRA > "$W/$name.log" 2>&1
  log "$name rc=$?"
  [ -n "$sampler" ] && kill $sampler
  [ -n "$spy" ] && { kill $spy 2> /dev/null; wait $spy 2> /dev/null; }
  collect; logs
}
profile_labelers() {  # py-spy on every labeler for PROFILE_S s, from 5 s after the run's first update
  command -v py-spy > /dev/null || return 0
  local name=$1 metrics="$W/runs/$1/metrics.jsonl"
  until [ -f "$metrics" ] && grep -q '"updates": [1-9]' "$metrics"; do sleep 1; done
  sleep 5
  local pids; pids=$(pgrep -f "ray::Labeler")
  for pid in $pids; do
    py-spy record --pid "$pid" --duration "$PROFILE_S" --rate 50 --format raw --nonblocking \
      --output "$W/pyspy_${name}_$pid.txt" > /dev/null 2>&1 &
  done
  wait
  for f in "$W"/pyspy_"${name}"_[0-9]*.txt; do [ -f "$f" ] && python3 launch/device/pyspy_top.py "$f"; done \
    > "$W/pyspy_${name}.json" 2>&1
}
placement() {  # which processes hold which GPU, once the env-reward run is acting
  sleep "${PLACEMENT_AT:-45}"; has_smi && nvidia-smi > "$W/placement.txt" 2>&1
}
# the runs in the order RUNS names them: that order is the priority when the call runs short (`train` skips a run
# that no longer fits)
clip() { RUN_UTD=$CLIP_UTD RUN_ENVS=$CLIP_ENVS train "$1" $WALL 120 reward=clip reward.model="$CLIP" topology.roles.env_runner.count=$CLIP_RUNNERS labeler.bus_items=1024 "${@:2}"; }
judge() { train "$1" $JUDGE_WALL 90 topology.roles.env_runner.count=$JUDGE_RUNNERS labeler.bus_items=256 "${@:2}"; }
for name in $RUNS; do
  case $name in
    env_frames)
      placement & probe=$!
      train env_frames $WALL 60 reward=env topology.roles.env_runner.count=$RUNNERS labeler.bus_items=1024
      kill $probe 2> /dev/null ;;
    clip_bf16) clip clip_bf16 reward.compile=true ;;
    clip_mps) clip clip_mps reward.compile=true topology.mps=true ;;
    # the same with every runner rendering on the learner's GPU 0: what the renderers cost the farm on its GPU, and
    # what they cost the learner (at UTD 0.25 it has room: 20 % busy in clip_mps, 2026-11-30)
    clip_mps_r0) clip clip_mps_r0 reward.compile=true topology.mps=true 'env.render_gpus=[0]' ;;
    clip_fp8) clip clip_fp8 reward.precision=fp8 ;;
    judge) judge judge reward=vlm_judge reward.model=$JUDGE ;;
    judge_mps) judge judge_mps reward=vlm_judge reward.model=$JUDGE topology.mps=true ;;
    # item 5: the judge labels a tenth of the frames once a PixelCNN student fitted online agrees; random weights
    # agree with nothing, so the student goes warm on the label count alone (warm_agreement=-1): a throughput figure
    distilled) FRAME_KEY=reward.teacher.frame_size judge distilled reward=distilled reward.teacher.model=$JUDGE \
                 reward.teacher_fraction=0.1 reward.warm_agreement=-1 reward.min_teacher_labels=2048 ;;
    *) log "unknown run $name (env_frames clip_bf16 clip_mps clip_mps_r0 clip_fp8 judge judge_mps distilled)" ;;
  esac
done
log "done"
collect; logs
python3 -c "import json; print(json.dumps(json.load(open('$OUT/issue36.json'))['checks'], indent=1))"

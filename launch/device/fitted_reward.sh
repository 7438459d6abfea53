#!/bin/bash
# Issue 19 on a 2-GPU machine: HalfCheetah from a reward fitted to frames, next to the env-reward run.
#   fitted_reward.sh env_and_fit   reward=env run (split_1_1, $WALL s), then rlfarm fit-reward on frames of its policy
#                                  (stacks of 2 renders: the reward is a velocity), fitted on the GPU
#   fitted_reward.sh fitted        the same run with reward=model reward.model=<the fit> (carried in fit/ if cold)
#   fitted_reward.sh refit         a second fit on frames of both policies (the env run's and the fitted run's, which
#                                  shows the states the first model overrates, labeled with the env's reward), and a
#                                  third run on it
#   fitted_reward.sh all | all2    env_and_fit + fitted (+ refit for all2), in one call (the device hands back only a few files, and a cold machine has
#                                  lost /tmp): everything is packed into $OUT/fitted_reward.tgz
# Env: WALL, RUNNERS, NUM_ENVS, FRAMES, FRAME_SIZE. Results (metrics, summaries, fit report, plots) go to $OUT.
set -uo pipefail
PHASE=${1:-env_and_fit}
source launch/device/gpu_env.sh
WALL=${WALL:-150}; RUNNERS=${RUNNERS:-12}; NUM_ENVS=${NUM_ENVS:-4}; FRAMES=${FRAMES:-40000}; FRAME_SIZE=${FRAME_SIZE:-64}
nvidia-smi -L > "$OUT/gpus.txt"; nproc >> "$OUT/gpus.txt"
RUN=(topology=split_1_1 env=halfcheetah run.live=false total_env_steps=100000000 run.max_wall_s=$WALL
     topology.roles.env_runner.count=$RUNNERS env.num_envs=$NUM_ENVS)
keep() {  # run dir → $OUT/<name>/ (no checkpoints)
  mkdir -p "$OUT/$1"; cp "$2"/{metrics.jsonl,summary.json,config.yaml,*.log,report.json,*.png} "$OUT/$1/" 2>/dev/null
  [ -d "$2/report" ] && cp -r "$2/report" "$OUT/$1/"
}
if [ "$PHASE" = all ] || [ "$PHASE" = all2 ]; then
  OUT_FINAL=$OUT; OUT=/tmp/pack; mkdir -p $OUT
  bash "$0" env_and_fit && bash "$0" fitted && { [ "$PHASE" = all ] || bash "$0" refit; }
  tar -czf "$OUT_FINAL/fitted_reward.tgz" -C /tmp pack; ls -la "$OUT_FINAL"; exit 0
elif [ "$PHASE" = env_and_fit ]; then
  timeout $((WALL + 120)) rlfarm train "${RUN[@]}" reward=env hydra.run.dir=/tmp/env_run > /tmp/env_run.log 2>&1
  echo "env run rc=$?"; tail -2 /tmp/env_run.log | cut -c1-600
  rlfarm report path=/tmp/env_run > /dev/null 2>&1; keep env_run /tmp/env_run
  timeout 400 rlfarm fit-reward env=halfcheetah policy=/tmp/env_run frames=$FRAMES frame_stack=2 frame_size=$FRAME_SIZE \
    num_envs=16 fit.epochs=10 fit.batch_size=512 hydra.run.dir=/tmp/fit > /tmp/fit.log 2>&1
  echo "fit rc=$?"; tail -1 /tmp/fit.log | cut -c1-600
  keep fit /tmp/fit; cp /tmp/fit/reward_model.pt "$OUT/fit/"
elif [ "$PHASE" = refit ]; then
  timeout 400 rlfarm fit-reward env=halfcheetah "policy=[/tmp/env_run,/tmp/fitted_run]" frames=$FRAMES frame_stack=2 \
    frame_size=$FRAME_SIZE num_envs=16 fit.epochs=10 fit.batch_size=512 hydra.run.dir=/tmp/refit > /tmp/refit.log 2>&1
  echo "refit rc=$?"; tail -1 /tmp/refit.log | cut -c1-600; keep refit /tmp/refit
  timeout $((WALL + 120)) rlfarm train "${RUN[@]}" reward=model reward.model=/tmp/refit/reward_model.pt \
    hydra.run.dir=/tmp/refitted_run > /tmp/refitted_run.log 2>&1
  echo "refitted run rc=$?"; tail -2 /tmp/refitted_run.log | cut -c1-600
  rlfarm report path=/tmp/refitted_run > /dev/null 2>&1; keep refitted_run /tmp/refitted_run
else
  MODEL=/tmp/fit/reward_model.pt; [ -f $MODEL ] || MODEL=$PWD/fit/reward_model.pt
  timeout $((WALL + 120)) rlfarm train "${RUN[@]}" reward=model reward.model=$MODEL hydra.run.dir=/tmp/fitted_run \
    > /tmp/fitted_run.log 2>&1
  echo "fitted run rc=$?"; tail -2 /tmp/fitted_run.log | cut -c1-600
  rlfarm report path=/tmp/fitted_run > /dev/null 2>&1; keep fitted_run /tmp/fitted_run
fi

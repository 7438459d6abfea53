#!/bin/bash
# Issue 18: APPO on Atari with the runners on the machine's cores (each acting on a small GPU share), the learner on
# GPU 0 (4 GPUs: split_1_3; 2 GPUs: split_1_1), env reward through the labelers; next to the env stage alone (same processes × sub-envs, random actions).
# Env: RUNNERS (52), LABELERS (4), LEARNERS (1; 2: data-parallel ranks, split_2_2), NUM_ENVS (16), WALL (300 s), GAME (Pong), BATCH_CHUNKS (2), EPOCHS (2), ALONE_S (20;
# 0: skip the env alone), EXTRA (more overrides), TAG (appo: names the outputs, so one call can run several variants).
# Carry .devpkgs (with the ale-py cp312 wheel in .devpkgs/whl) and .gl.
# Results: $OUT/env_alone.json, $OUT/$TAG.json, $OUT/$TAG.tgz.
set -uo pipefail

source launch/device/gpu_env.sh   # the staged packages (and GL loaders, should anything import MuJoCo)
RUNNERS=${RUNNERS:-52}; NUM_ENVS=${NUM_ENVS:-16}; WALL=${WALL:-300}; GAME=${GAME:-Pong}
read -r -a EXTRA <<< "${EXTRA:-}"
ENV_ID=rlfarm.envs.atari:RlfarmAtari-v0
{ nvidia-smi -L; nproc; } > "$OUT/machine.txt"
TAG=${TAG:-appo}
if [ "${ALONE_S:-20}" != 0 ]; then
  python3 launch/device/env_alone.py $ENV_ID "$RUNNERS" "$NUM_ENVS" ${ALONE_S:-20} game=$GAME > "$OUT/env_alone.json" 2>/tmp/env_alone.err
  cat "$OUT/env_alone.json"; tail -3 /tmp/env_alone.err
fi
nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader,nounits -l 1 > /tmp/gpu_$TAG.csv &
smi=$!
NGPU=$(nvidia-smi -L | wc -l)  # 4: split_1_3 (runners share GPUs 1-3); 2: split_1_1 (runners share GPU 1)
# LEARNERS=2 on 4 GPUs: split_2_2, two data-parallel learner ranks on GPUs 0-1, the runners sharing GPUs 2-3.
LEARNERS=${LEARNERS:-1}
if [ "$LEARNERS" -gt 1 ]; then TOPO=split_2_2; POOL=serve; SERVE=$((NGPU - LEARNERS))
else TOPO=$([ "$NGPU" -ge 4 ] && echo split_1_3 || echo split_1_1); POOL=$([ "$NGPU" -ge 4 ] && echo reward || echo serve); SERVE=$((NGPU - 1)); fi
SHARE=$(python3 -c "import math; print(round(0.99 / math.ceil($RUNNERS / $SERVE), 4))")
timeout $((WALL + 200)) rlfarm train algo=appo env=atari model=cnn_actor_critic env.kwargs.game=$GAME \
  env.num_envs=$NUM_ENVS topology=$TOPO topology.roles.env_runner.count=$RUNNERS \
  topology.roles.env_runner.pool=$POOL topology.roles.env_runner.gpus=$SHARE topology.roles.learner.count=$LEARNERS \
  topology.roles.labeler.count=${LABELERS:-4} topology.roles.labeler.pool=null topology.roles.labeler.gpus=0 \
  algo.chunk_steps=32 algo.batch_chunks=${BATCH_CHUNKS:-2} algo.lr=5e-4 algo.gamma=0.99 algo.lam=0.95 algo.epochs=${EPOCHS:-2} \
  algo.clip_eps=0.1 algo.max_policy_lag=50 labeler.bus_items=4096 total_env_steps=1000000000 \
  run.max_wall_s=$WALL run.live=false hydra.run.dir=/tmp/$TAG "${EXTRA[@]}" > /tmp/$TAG.log 2>&1
echo "$TAG rc=$?"; kill $smi
tail -3 /tmp/$TAG.log | cut -c1-600
python3 launch/device/collect.py main /tmp/$TAG /tmp/gpu_$TAG.csv > "$OUT/$TAG.json"
cp /tmp/$TAG.log /tmp/gpu_$TAG.csv /tmp/$TAG/ 2>/dev/null
tar -C /tmp --exclude=checkpoints -czf "$OUT/$TAG.tgz" $TAG

#!/bin/bash
# Issue 8 on a 4-GPU machine: split_1_3 (learner GPU 0, labeling farm GPUs 1-3) with a ViT-L/14-shaped CLIP
# reward tower on rendered HalfCheetah frames.   usage: split_1_3.sh scaling|main
set -uo pipefail
PHASE=${1:-scaling}
source launch/device/gpu_env.sh
nvidia-smi -L > "$OUT/gpus.txt"
CLIP=/tmp/clip-l14
[ -d $CLIP ] || python3 -m rlfarm.rewards.clip_factory --shape vit-l-14 --out $CLIP > /dev/null 2>&1
COMMON=(topology=split_1_3 env=halfcheetah reward=clip reward.model=$CLIP reward.compile=true run.live=false
        labeler.bus_items=512 labeler.bus_timeout_s=0.5 total_env_steps=100000000)

sample_gpus() { nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader,nounits -l 1 > "$1" & echo $!; }
placement() {  # which process sits on which GPU, by Ray's process titles
  nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader > /tmp/apps.csv
  while IFS=, read -r pid uuid mem; do
    echo "$(nvidia-smi -L | grep "${uuid// /}" | cut -d: -f1) | $(ps -o cmd= -p "$pid" | cut -c1-40) | pid $pid |$mem"
  done < /tmp/apps.csv | sort
}

if [ "$PHASE" = scaling ]; then
  rlfarm plan topology=split_1_3 > "$OUT/plan.txt" 2>&1
  # Farm capacity with 1, 2, 3 reward GPUs (2 labelers each): the learner only stores (learning_starts is
  # never reached), so the farm and the renderers are the only limits. 24 runners keep the farm fed.
  for g in 1 2 3; do
    pid=$(sample_gpus /tmp/gpu_$g.csv)
    timeout 200 rlfarm train "${COMMON[@]}" hydra.run.dir=/tmp/scale_$g topology.pools.reward.gpus=$g \
      topology.roles.labeler.count=$((2 * g)) topology.roles.env_runner.count=${RUNNERS:-48} reward.frame_size=${FRAME:-84} algo.learning_starts=1000000000 \
      run.max_wall_s=90 > /tmp/scale_$g.log 2>&1
    kill $pid; echo "reward GPUs $g: rc=$?"; tail -2 /tmp/scale_$g.log | cut -c1-300
  done
  python3 launch/device/collect.py scaling /tmp/scale_1 /tmp/scale_2 /tmp/scale_3 > "$OUT/scaling.json"
else
  pid=$(sample_gpus /tmp/gpu_main.csv)
  timeout 450 rlfarm train "${COMMON[@]}" hydra.run.dir=/tmp/main run.max_wall_s=360 > /tmp/main.log 2>&1 &
  train=$!
  sleep 150; placement > "$OUT/placement.txt"; nvidia-smi >> "$OUT/placement.txt"
  wait $train; echo "main rc=$?"; kill $pid
  tail -3 /tmp/main.log | cut -c1-600
  cp /tmp/main/summary.json "$OUT/main_summary.json"
  python3 launch/device/collect.py main /tmp/main > "$OUT/main.json"
fi

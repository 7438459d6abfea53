#!/usr/bin/env bash
# ManiSkill3 batched scenes on a GPU machine (rlfarm/envs/maniskill_gpu.py): `probe` checks what runs (imports, Vulkan
# on the GPU, GPU simulation, the tiny VLA's sampling rate); `bench` runs `rlfarm bench maniskill device=cuda [overrides]`.
# No Ray is needed. Carry `.gl` (GL/Vulkan loaders) and `.mswhl`, which holds site.tar.xz: sapien 3.0.3 (cp312),
# mani_skill 3.0.1 and their pure-Python needs plus hydra-core/omegaconf/antlr4, unpacked into one folder and trimmed
# (no headers, examples, environment maps, robots other than the Panda, replicacad data): ~49 MB, fits the 64 MiB carry;
# .mswhl/stubs/IPython stands in for IPython, which mani_skill imports for its notebook helpers only.
# GPU simulation also needs PhysX's GPU library (not in the sapien wheel; SAPIEN downloads it from GitHub on first
# use): put libPhysXGpu_64.so in .mswhl/ and this script installs it where SAPIEN looks.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
mode=${1:-probe}; shift || true
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
[ -d /tmp/site/mani_skill ] || { mkdir -p /tmp/site && xz -dc .mswhl/site.tar.xz | tar -xf - -C /tmp/site; }
export PYTHONPATH="$PWD:/tmp/site:$PWD/.mswhl/stubs" PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f $icd ] && export VK_DRIVER_FILES=$icd
[ -f /usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json ] && \
  export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
if [ -f .mswhl/libPhysXGpu_64.so ]; then
  lib=$(python3 -c "from rlfarm.envs.maniskill_gpu import physx_gpu_library as p; print(p())")
  mkdir -p "$(dirname "$lib")" && cp .mswhl/libPhysXGpu_64.so "$lib"
fi
case $mode in
  probe) timeout 400 python3 launch/device/maniskill_probe.py 2>&1 | tee "$OUT/maniskill_probe.log" ;;
  bench) python3 -m rlfarm bench maniskill device=cuda hydra.run.dir=/tmp/bench_maniskill "$@" \
           > "$OUT/bench_maniskill.log" 2>&1
         echo "bench maniskill exit $?" >> "$OUT/bench_maniskill.log"; tail -40 "$OUT/bench_maniskill.log"
         cp /tmp/bench_maniskill/bench.json "$OUT/bench_maniskill.json" 2>/dev/null || true ;;
  *) echo "usage: maniskill_gpu.sh probe|bench [overrides]"; exit 2 ;;
esac

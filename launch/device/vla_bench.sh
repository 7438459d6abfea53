#!/usr/bin/env bash
# `rlfarm bench vla` on a GPU machine. SAPIEN (51 MB) and the staged Ray (.devpkgs, 44 MB) do not fit in one
# device call's carry, so: a call that carries .devpkgs first (it unpacks Ray/Hydra into /tmp/site), then, on the
# still-warm machine, a call that carries .simwhl (sapien + its pure-Python deps, cp312 wheels) and runs this.
#   pip download sapien==3.0.3 transforms3d pyperclip importlib_resources --python-version 3.12 \
#       --only-binary=:all: --no-deps -d .simwhl
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -d /tmp/site/ray ] || { echo "no /tmp/site/ray: run a call that carries .devpkgs first (warm machine)"; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .simwhl/*.whl
export PYTHONPATH="$PWD:/tmp/site" PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m rlfarm bench vla device=cuda hydra.run.dir=/tmp/bench_vla "$@" > "$OUT/bench_vla.log" 2>&1
echo "bench vla exit $?" >> "$OUT/bench_vla.log"
cp /tmp/bench_vla/bench.json "$OUT/bench_vla.json" 2>/dev/null || true

#!/usr/bin/env bash
# `rlfarm bench vla` on a GPU machine (issue 17: a VLA-sized policy, sequential loop vs W workers + one inference
# server). SAPIEN (51 MB) and the staged Ray (.devpkgs) do not fit in one device call's carry, so two calls:
#   1. carry .devpkgs:  source .devpkgs/setup.sh && bash launch/device/vla_bench.sh prepare
#      unpacks Ray/Hydra into /tmp/site, builds the random VLA-sized checkpoints into /tmp/rlfarm-vla-<shape> on the
#      GPU, and times the server's decoding (eager vs CUDA graphs) without envs: $OUT/prepare.json + prepare.log;
#   2. within 30 s, on the still-warm machine, carry .simwhl (sapien + its pure-Python deps, cp312 wheels):
#      bash launch/device/vla_bench.sh [shape ...]  (default: vitb16-qwen0.5b)
#      runs the bench once per shape: $OUT/bench_vla_<shape>.json + .log.
#   pip download sapien==3.0.3 transforms3d pyperclip importlib_resources --python-version 3.12 \
#       --platform manylinux_2_28_x86_64 --only-binary=:all: --no-deps -d .simwhl   (and /.simwhl/ in .git/info/exclude)
set -uo pipefail
export OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH="$PWD:/tmp/site" PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -d /tmp/site/ray ] || { echo "no /tmp/site/ray: run a call that carries .devpkgs first (warm machine)"; exit 3; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1

if [ "${1:-}" = prepare ]; then
  python3 - > "$OUT/prepare.log" 2>&1 <<'PY'
import json, os, subprocess, sys, time
import torch
from rlfarm.algos.vla import VLAConfig
from rlfarm.models.lm_factory import count_parameters
from rlfarm.roles.vla_server import GraphedDecoding, inference_policy

report = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
for shape in os.environ.get("SHAPES", "vitb16-qwen0.5b vitl14-qwen0.5b").split():
    path, row = f"/tmp/rlfarm-vla-{shape}", {}
    started = time.perf_counter()
    if not os.path.exists(f"{path}/config.json"):
        subprocess.run([sys.executable, "-m", "rlfarm.models.lm_factory", "--vla", "--shape", shape, "--out", path,
                        "--device", "cuda"], check=True)
    row["build_s"], row["parameters"] = round(time.perf_counter() - started, 1), count_parameters(path)
    cfg = VLAConfig(env={"image_size": 64}, chunk_size=8, model={"source": path, "max_words": 16})
    started = time.perf_counter()
    policy = inference_policy(cfg, {"action_dim": 2, "proprio_dim": 4, "image_size": 64}, "cuda:0")
    row["load_s"] = round(time.perf_counter() - started, 1)
    started = time.perf_counter()
    decoding, row["graphs"] = GraphedDecoding.build(policy, "cuda:0", 256)
    row["capture_s"] = round(time.perf_counter() - started, 1)
    gen = torch.Generator("cuda:0").manual_seed(0)
    for batch in (64, 256):
        image = torch.randint(0, 255, (batch, 3, 64, 64), dtype=torch.uint8, device="cuda:0")
        words = torch.as_tensor(policy.tokenizer.encode(["push the cube to the left"] * batch), device="cuda:0")
        pixels, ids, mask = policy._inputs(image, words)
        ways = {"prefill only": lambda: policy.policy.model(input_ids=ids, pixel_values=pixels, attention_mask=mask,
                                                           logits_to_keep=1),
                "eager decoding": lambda: policy.sample(image, words, None, 1.6, gen)}
        if decoding is not None:
            ways["graph decoding"] = lambda: decoding.sample(image, words, 1.6, gen)
        for name, work in ways.items():
            with torch.no_grad():
                work()
                torch.cuda.synchronize()
                started = time.perf_counter()
                for _ in range(3):
                    work()
                torch.cuda.synchronize()
            row[f"{name} ms @ {batch}"] = round((time.perf_counter() - started) / 3 * 1000, 1)
        if decoding is not None:  # graph-decoded tokens, teacher-forced by the same bf16 model
            tokens, logprobs = decoding.sample(image, words, 1.6, gen)
            with torch.no_grad():
                again = policy.token_logprobs(image, words, None, tokens, 1.6)
            row[f"graph vs recompute max |dlogp| @ {batch}"] = float((again - logprobs).abs().max())
    row["max_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    report[shape] = row
    print(shape, row, flush=True)
    del policy, decoding
    torch.cuda.empty_cache()
json.dump(report, open(os.environ["OUT"] + "/prepare.json", "w"), indent=1)
PY
  echo "prepare exit $?" >> "$OUT/prepare.log"
  exit 0
fi

python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .simwhl/*.whl
for shape in "${@:-vitb16-qwen0.5b}" ; do
  python3 -m rlfarm bench vla device=cuda hydra.run.dir=/tmp/bench_vla_$shape bench.sizes.model_shape=$shape \
    > "$OUT/bench_vla_$shape.log" 2>&1
  echo "bench vla $shape exit $?" >> "$OUT/bench_vla_$shape.log"
  cp /tmp/bench_vla_$shape/bench.json "$OUT/bench_vla_$shape.json" 2>/dev/null || true
done

"""The reward models' bare batched ceilings on one GPU, for issue 36's end-to-end runs (issue36_split_1_1.sh).

Each figure is a `direct` row of `rlfarm bench labeler`: the same reward config (conf/reward/*.yaml as the bench sets
it), the same sizes (conf/bench/labeler.yaml `sizes`, and `judge` over them) and the same timed call
(`rlfarm.bench.labeler.direct_rate`: `direct_batches` calls on `batch` preloaded frames, median of `repeats`), on a
labeler's one CPU thread. The bench's inline and farm rows are left out: the end-to-end runs are the farm here, and
a device call has no minutes to spare. The CLIP tower is the saved model the runs load (its compile then finds
inductor's cache warm in the runs' labelers).

One process per model, started together: each builds (and compiles) its model, waits until every peer has, then
times its calls holding a lock on the GPU, so the compiles overlap and no timing overlaps anything.

usage: python3 launch/device/ceilings.py CASE CLIP_DIR JUDGE_SHAPE SYNC_DIR [cuda|cpu] > CASE.json
  CASE: clip_bf16 | clip_fp8 | judge; CLIP_DIR: a `python3 -m rlfarm.rewards.clip_factory --out` folder; JUDGE_SHAPE:
  a rlfarm.rewards.vlm_factory shape (qwen2-vl-2b_shape); SYNC_DIR: a folder shared by the peers, holding PEERS (their
  number) and their ready files; cpu: a dry run at the bench's CPU sizes with a `--shape tiny` CLIP_DIR and tiny_shape
  (no fp8 there: it needs an Ada or Hopper GPU).
"""
from __future__ import annotations

import fcntl
import json
import sys
import time
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from rlfarm.bench import labeler as bench
from rlfarm.config import CONF_DIR

JUDGE_DIRECT_BATCHES = 4  # the bench's one call of 256 frames is ~0.7 s at the 2B shape: four make a steadier figure
PEERS_TIMEOUT_S = 300


def reward_and_sizes(case: str, clip_dir: str, judge_shape: str, device: str):
    cfg = OmegaConf.load(CONF_DIR / "bench" / "labeler.yaml")
    cfg.compile = device == "cuda"
    if case == "judge":
        cfg.reward = "vlm_judge"
        size = bench.bench_sizes(cfg, device)
        if device == "cuda":
            size.direct_batches = JUDGE_DIRECT_BATCHES
        return bench.judge_reward_cfg(cfg, judge_shape, size), size
    size = bench.bench_sizes(cfg, device)
    reward = bench.clip_reward_cfg(cfg, Path(clip_dir), "vit-l-14" if device == "cuda" else "tiny", size, device)
    return ({**reward, "precision": "fp8"} if case == "clip_fp8" else reward), size


def wait_for_peers(sync: Path, case: str) -> None:
    (sync / f"{case}.ready").touch()
    peers, deadline = int((sync / "PEERS").read_text()), time.monotonic() + PEERS_TIMEOUT_S
    while len(list(sync.glob("*.ready"))) < peers and time.monotonic() < deadline:
        time.sleep(0.5)


def main(case: str, clip_dir: str, judge_shape: str, sync_dir: str, device: str) -> dict:
    reward_cfg, size = reward_and_sizes(case, clip_dir, judge_shape, device)
    sync = Path(sync_dir)
    started = time.perf_counter()
    try:
        model = instantiate(reward_cfg)
        model.setup("cuda:0" if device == "cuda" else "cpu")
    except Exception:
        wait_for_peers(sync, case)  # a peer must not wait out the timeout for this one
        raise
    setup_s = time.perf_counter() - started
    wait_for_peers(sync, case)
    with open(sync / "gpu.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with bench.torch_threads(1):  # split_1_1's labelers run on one thread
            rate = bench.direct_rate(model, size, device, reward_cfg["frame_size"])
    return {"img_per_s": round(rate, 1), "batch": int(size.batch), "frames_per_forward": reward_cfg["max_batch"],
            "direct_batches": int(size.direct_batches), "repeats": int(size.repeats), "setup_s": round(setup_s, 1),
            "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu"}


if __name__ == "__main__":
    arguments = sys.argv[1:]
    try:
        result = main(*arguments[:4], arguments[4] if len(arguments) > 4 else "cuda")
    except Exception as error:  # one model's failure must not hide the others' figures
        result = {"error": f"{type(error).__name__}: {error}"[:400]}
    print(json.dumps(result))

"""`rlfarm bench sync` (issue 4, P5): how long a learner → engine weight sync takes, next to a raw copy of
the same bytes measured in the same run.

The state is the trainable tensors of a Qwen2.5-0.5B-shaped model (random weights, bf16 on CUDA; a tiny
float32 model on CPU), or of a named shape (`bench.shape=qwen2_5_7b_shape`: 15.2 GB, a 7B policy's publication).
This process is the learner (rank 0, first GPU); a second process (`python -m rlfarm.bench.sync <request.json>`,
second GPU) holds a real `HFEngine` on the same architecture. Cases:
- `raw copy <src>→<dst>`: one flat buffer of the state's bytes copied device to device (the baseline);
- `broadcast`: `BroadcastSender` → `BroadcastReceiver` → `HFEngine.update_weights` (NCCL on GPUs, gloo on
  CPU), timed in the engine process from a common barrier until its last copy is done;
- `in place`: a second engine in this process, on the learner's device, loading the learner's tensors
  (the colocated path), next to a raw same-device copy;
- `object store (host copies)`: the learner's tensors to host memory (`HostSender`) plus the engine's
  load from host memory; Ray's own put/get (serialization into shared memory) comes on top and is not in it.
Values are GB/s of state moved (higher is better); each row also has `ms`.
"""
from __future__ import annotations

import faulthandler
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from omegaconf import DictConfig

from rlfarm.bench.common import sizes
from rlfarm.bench.engine import model_shape
from rlfarm.engines.base import load_into
from rlfarm.engines.hf import HFEngine
from rlfarm.models.lm import build_causal_lm, trainable_state_dict
from rlfarm.sync import (BroadcastReceiver, BroadcastSender, HostSender, InPlaceSender, Layout, PassThroughReceiver,
                         join_group, plan_layout, serve_rendezvous)

UNIT = "GB/s (higher is better)"
log = logging.getLogger("rlfarm")
# NVLink multicast must stay off on the shared GPU machines; the engine process inherits these.
SAFE_NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def run(cfg: DictConfig, device: str) -> list[dict]:
    size = sizes(cfg, device)
    for key, value in SAFE_NCCL_ENV.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("NCCL_DEBUG", "WARN")  # NCCL says why, should a transfer fail
    learner_device, engine_device = devices(device)
    dtype = str(cfg.dtype) if device == "cuda" else "float32"
    model_cfg = model_shape(cfg.get("shape"), size.model)
    repeats = int(size.repeats)
    learner = build_model(model_cfg, dtype, learner_device, seed=0)
    state = trainable_state_dict(learner)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    common = {"unit": UNIT, "bytes": nbytes, "tensors": len(state)}

    def row(case: str, seconds: float, baseline: str | None, **extra) -> dict:
        return {"case": case, "value": nbytes / seconds / 1e9, "baseline": baseline, "ms": round(seconds * 1e3, 3),
                **common, **extra}

    raw_split = f"raw copy {learner_device}→{engine_device}"
    raw_local = f"raw copy {learner_device}→{learner_device}"
    log.info("sync bench: %d tensors, %.1f MB on %s", len(state), nbytes / 1e6, learner_device)
    rows = [row(raw_split, raw_copy_s(nbytes, learner_device, engine_device, repeats), None)]
    if engine_device != learner_device:
        rows.append(row(raw_local, raw_copy_s(nbytes, learner_device, learner_device, repeats), None))

    edge_mb = size.get("edge_mb")
    layout = plan_layout(state, int(float(size.bucket_mb) * 2**20),
                         None if edge_mb is None else int(float(edge_mb) * 2**20))
    broadcast, host = broadcast_and_host_s(state, model_cfg, dtype, engine_device, layout, repeats,
                                           learner_device, float(size.timeout_s), float(size.stack_dump_s))
    rows.append(row(f"broadcast ({'nccl' if device == 'cuda' else 'gloo'})", broadcast["sync_s"], raw_split,
                    buckets=len(layout.buckets), bucket_mb=float(size.bucket_mb), edge_mb=edge_mb))
    rows.append(row("object store (host copies)", host["to_host_s"] + broadcast["from_host_s"], raw_split,
                    to_host_ms=round(host["to_host_s"] * 1e3, 3),
                    from_host_ms=round(broadcast["from_host_s"] * 1e3, 3)))

    colocated = HFEngine(build_model(model_cfg, dtype, learner_device, seed=1), pad_id=0, device=learner_device)
    in_place = timed(lambda version: load_into(colocated, PassThroughReceiver(), InPlaceSender().send(state), version),
                     learner_device, repeats)
    rows.append(row("in place (colocated)", in_place, raw_local if engine_device != learner_device else raw_split))
    return rows


def devices(device: str) -> tuple[str, str]:
    if device != "cuda":
        return "cpu", "cpu"
    if torch.cuda.device_count() < 2:
        raise RuntimeError("rlfarm bench sync on CUDA needs two GPUs (learner and engine); use device=cpu")
    return "cuda:0", "cuda:1"


def build_model(model_cfg: dict, dtype: str, device: str, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    with torch.device(device):  # initialize on the device: a CPU init of 0.5B parameters takes seconds
        return build_causal_lm(model_cfg).to(getattr(torch, dtype)).eval()


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def timed(work, device: str, repeats: int) -> float:
    """Median seconds of `work(i)` over `repeats` calls after one warm-up, the device synchronized around each."""
    times = []
    for i in range(repeats + 1):
        synchronize(device)
        started = time.perf_counter()
        work(i)
        synchronize(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


def raw_copy_s(nbytes: int, src: str, dst: str, repeats: int) -> float:
    source = torch.empty(nbytes, dtype=torch.uint8, device=src)
    target = torch.empty(nbytes, dtype=torch.uint8, device=dst)

    def copy(_):
        target.copy_(source)
        synchronize(src)
    return timed(copy, dst, repeats)


def broadcast_and_host_s(state: dict, model_cfg: dict, dtype: str, engine_device: str, layout: Layout,
                         repeats: int, learner_device: str, timeout_s: float, stack_dump_s: float = 60
                         ) -> tuple[dict, dict]:
    """Runs the engine process; returns its timings (sync_s, from_host_s, buckets) and ours (to_host_s).
    Should the two processes stall, each prints its Python stacks after `stack_dump_s`, so a hang names its line."""
    store = serve_rendezvous(world_size=2, timeout_s=timeout_s)
    with tempfile.TemporaryDirectory(prefix="rlfarm-bench-sync-") as folder:
        request, result = Path(folder) / "request.json", Path(folder) / "result.json"
        peer_env, peer_device = engine_view(engine_device)
        request.write_text(json.dumps({"address": f"127.0.0.1:{store.port}", "model": model_cfg, "dtype": dtype,
                                       "device": peer_device, "repeats": repeats, "timeout_s": timeout_s,
                                       "result": str(result), "stack_dump_s": stack_dump_s}))
        peer = subprocess.Popen([sys.executable, "-m", "rlfarm.bench.sync", str(request)],
                                env={**os.environ, **SAFE_NCCL_ENV, **peer_env})
        finished = threading.Event()
        threading.Thread(target=report_early_exit, args=(peer, finished), daemon=True).start()
        try:
            log.info("sync bench: engine process started, joining the group")
            group = join_group(store, rank=0, world_size=2, device=learner_device, timeout_s=timeout_s)
            log.info("sync bench: group joined")
            faulthandler.dump_traceback_later(stack_dump_s)
            sender = BroadcastSender(group, layout)
            for _ in range(repeats + 1):  # the engine times each from the barrier; the first is a warm-up
                barrier(group)
                sender.send(state)
                synchronize(learner_device)
            barrier(group)  # the engine has finished before this process tears the group down
            log.info("sync bench: broadcasts done")
            to_host_s = timed(lambda _: HostSender().send(state), learner_device, repeats)
            finished.set()
            # NCCL tears a communicator down with every member at once: close while the engine closes, before
            # waiting for it to exit (waiting first leaves both sides in ncclCommFinalize for good).
            group.close()
            faulthandler.cancel_dump_traceback_later()
            if peer.wait(timeout=timeout_s) != 0:
                raise RuntimeError(f"the engine process of the sync bench failed (exit {peer.returncode})")
            timings = json.loads(result.read_text())
        finally:
            if peer.poll() is None:
                peer.kill()
    return timings, {"to_host_s": to_host_s}


def engine_view(engine_device: str) -> tuple[dict, str]:
    """The engine process sees only its own GPU, as an engine role placed by Ray does (CUDA_VISIBLE_DEVICES),
    so NCCL picks the transport the training loop gets."""
    device = torch.device(engine_device)
    if device.type != "cuda":
        return {}, engine_device
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    physical = visible.split(",")[device.index] if visible else str(device.index)
    return {"CUDA_VISIBLE_DEVICES": physical}, "cuda:0"


def report_early_exit(peer: subprocess.Popen, finished: threading.Event) -> None:
    """A peer that dies mid-sync leaves this process waiting inside NCCL: say so while it waits."""
    while not finished.wait(1.0):
        if peer.poll() is not None:
            log.error("sync bench: the engine process exited (code %s) while this one waits on it", peer.returncode)
            return


def barrier(group) -> None:
    group.broadcast(torch.zeros(1, device=group.device)).wait()
    synchronize(str(group.device))


def engine_process(request: dict) -> None:
    """Rank 1: a real engine that receives `repeats + 1` syncs, each timed from the barrier to its last copy."""
    faulthandler.enable()  # a crash in native code prints the Python stack
    device = request["device"]
    print(f"sync bench engine process: joining {request['address']} on {device}", file=sys.stderr, flush=True)
    group = join_group(request["address"], rank=1, world_size=2, device=device, timeout_s=request["timeout_s"])
    print("sync bench engine process: joined", file=sys.stderr, flush=True)
    faulthandler.dump_traceback_later(request["stack_dump_s"])
    engine = HFEngine(build_model(request["model"], request["dtype"], device, seed=1), pad_id=0, device=device)
    receiver = BroadcastReceiver(group)
    times = []
    for version in range(request["repeats"] + 1):
        barrier(group)
        started = time.perf_counter()
        load_into(engine, receiver, None, version)
        synchronize(device)
        times.append(time.perf_counter() - started)
    barrier(group)
    host_state = {name: t.detach().cpu() for name, t in trainable_state_dict(engine.model).items()}
    from_host_s = timed(lambda version: load_into(engine, PassThroughReceiver(), host_state, version), device,
                        request["repeats"])
    Path(request["result"]).write_text(json.dumps({"sync_s": statistics.median(times[1:]),
                                                   "from_host_s": from_host_s}))
    group.close()  # the learner closes its side at the same time (see broadcast_and_host_s)
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    engine_process(json.loads(Path(sys.argv[1]).read_text()))

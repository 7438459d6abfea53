"""Headless MuJoCo render rates on the GPU machine: which EGL vendor renders, one process's step + render rate
at a few frame sizes, and the aggregate rate of many processes at once (as many env runners would).
usage: python3 launch/device/render_probe.py [processes ...]   (prints JSON lines)"""
import json
import multiprocessing as mp
import os
import sys
import time


def probe(size: int, steps: int, device_id: int | None, out) -> None:
    if device_id is not None:
        os.environ["MUJOCO_EGL_DEVICE_ID"] = str(device_id)
    import gymnasium as gym
    import numpy as np

    env = gym.make("HalfCheetah-v5", render_mode="rgb_array", width=size, height=size)
    env.unwrapped.model.vis.quality.shadowsize = 0
    env.unwrapped.model.mat_reflectance[:] = 0
    env.reset(seed=0)
    env.render()
    renderer = "?"
    try:
        from OpenGL import GL
        renderer = GL.glGetString(GL.GL_RENDERER).decode()
    except Exception as error:  # noqa: BLE001
        renderer = f"unknown ({type(error).__name__})"
    action = np.zeros(env.action_space.shape, dtype=np.float32)
    t = time.perf_counter()
    for _ in range(steps):
        env.step(action)
    step_s = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(steps):
        env.step(action)
        env.render()
    both_s = time.perf_counter() - t
    out.put({"size": size, "renderer": renderer, "step_per_s": steps / step_s, "step_render_per_s": steps / both_s})


def run(size, steps, procs):
    q = mp.get_context("spawn").Queue()
    ps = [mp.get_context("spawn").Process(target=probe, args=(size, steps, i % int(os.environ.get("NGPU", "1")) if procs > 1 else None, q)) for i in range(procs)]
    t = time.perf_counter()
    for p in ps:
        p.start()
    rows = [q.get(timeout=300) for _ in ps]
    for p in ps:
        p.join()
    return rows, time.perf_counter() - t


if __name__ == "__main__":
    print(json.dumps({"cpus": os.cpu_count(), "egl_vendor_file": os.environ.get("__EGL_VENDOR_LIBRARY_FILENAMES")}))
    for size in (84, 224):
        rows, _ = run(size, 300, 1)
        print(json.dumps({"procs": 1, **rows[0]}), flush=True)
    for procs in map(int, sys.argv[1:]):
        rows, wall = run(224, 300, procs)
        print(json.dumps({"procs": procs, "size": 224, "renderers": sorted({r["renderer"] for r in rows}),
                          "sum_step_render_per_s": round(sum(r["step_render_per_s"] for r in rows)),
                          "median_one": round(sorted(r["step_render_per_s"] for r in rows)[procs // 2])}), flush=True)

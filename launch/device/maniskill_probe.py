"""What of ManiSkill3 GPU simulation runs on this machine (launch/device/maniskill_gpu.sh probe): imports, the
Vulkan device, GPU physics (a subprocess with a deadline: SAPIEN downloads PhysX's GPU library on first use and a
machine without internet may hang there), then the figures that need no GPU physics: one CPU-physics scene rendered
on the GPU, and the tiny VLA's sampling rate at the bench's batch sizes."""
import json
import os
import subprocess
import sys
import time

import torch

report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
print(report, flush=True)
import sapien  # noqa: E402
import mani_skill  # noqa: E402

report |= {"sapien": sapien.__version__, "mani_skill": mani_skill.__version__}
from rlfarm.envs.maniskill_gpu import ManiSkillGPUTasks, physx_gpu_library  # noqa: E402

report["physx_gpu_library"] = str(physx_gpu_library())
report["physx_gpu_library_present"] = physx_gpu_library().exists()
t = time.perf_counter()
sapien.render.RenderSystem(sapien.Device("cuda"))
report["vulkan_render_system_s"] = round(time.perf_counter() - t, 2)
print(report, flush=True)

# GPU physics, as ManiSkill asks for it (its own download attempt included), in a subprocess with a deadline
code = """import gymnasium as gym, mani_skill.envs, time, torch
env = gym.make("PushCube-v1", num_envs=256, sim_backend="physx_cuda", obs_mode="rgb",
               sensor_configs=dict(width=64, height=64))
env.reset(seed=list(range(256)))
a = torch.zeros(256, *env.unwrapped.single_action_space.shape, device="cuda")
for _ in range(5): env.step(a)
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(50): obs, *_ = env.step(a)
torch.cuda.synchronize(); print("GPU_SIM_OK steps/s", 256 * 50 / (time.perf_counter() - t))
"""
try:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    report["gpu_sim_rc"], tail = out.returncode, (out.stdout + out.stderr).strip().splitlines()[-6:]
except subprocess.TimeoutExpired as error:
    report["gpu_sim_rc"], tail = "timeout 90 s", str((error.stdout or b"")[-400:]).splitlines()[-3:]
report["gpu_sim_tail"] = tail
print("gpu sim:", report["gpu_sim_rc"], "\n".join(tail), flush=True)
os.system("ls -la ~/.sapien/physx/*/ 2>&1 | head; getent hosts github.com || echo 'github.com: no DNS'")

# One CPU-physics scene (ManiSkill's CPU backend holds one), pictures on the GPU: the per-process floor.
tasks = ManiSkillGPUTasks("PushCube-v1", 1, 64, 50, render_device="cuda", sim_backend="cpu")
tasks.reset([0])
t, chunks = time.perf_counter(), 40
for i in range(chunks):
    if tasks.step_chunk(torch.rand(1, 5, 4) * 2 - 1).done.all():
        tasks.reset([i])
report["cpu_sim_one_scene_gpu_render_steps_per_s"] = round(chunks * 5 / (time.perf_counter() - t), 1)
tasks.close()
print(report, flush=True)

# The tiny VLA's sampling alone at the bench's sizes: the end-to-end ceiling the policy side sets.
from rlfarm.envs.maniskill_tasks import instruction_vocabulary  # noqa: E402
from rlfarm.models.vla import tiny_vla  # noqa: E402

rates = {}
for size in (64, 128):
    policy = tiny_vla(instruction_vocabulary(("PushCube-v1",)), 4, 5, 5, image_size=size).cuda().eval()
    for n in (256, 1024, 4096):
        image = torch.randint(0, 255, (n, 3, size, size), dtype=torch.uint8, device="cuda")
        words = torch.randint(2, 10, (n, 12), device="cuda")
        proprio = torch.randn(n, 5, device="cuda")
        for _ in range(3):
            policy.sample(image, words, proprio)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(20):
            policy.sample(image, words, proprio)
        torch.cuda.synchronize()
        rates[f"{size}px x{n}"] = round(20 * n * 5 / (time.perf_counter() - t))
report["tiny_vla_alone_env_steps_per_s"] = rates
print(json.dumps(report, indent=1), flush=True)
with open(os.path.join(os.environ.get("OUT", "/tmp"), "maniskill_probe.json"), "w") as f:
    json.dump(report, f, indent=1)

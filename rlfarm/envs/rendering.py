"""One env as the runners build it, and its frames: headless rendering set up before anything renders, MuJoCo
drawn at the frame size directly (shadows and reflections off), classic-control envs drawn with pygame and
resized, and the per-process rendering settings of a runner (which GPU draws, how many software-GL threads).

Headless rendering: MuJoCo uses EGL (`MUJOCO_GL=egl` unless set) with shadows and reflections off; classic-control
envs use pygame's dummy video driver. Rates are in docs/benchmarks.md (`rlfarm bench env`)."""
from __future__ import annotations

import glob
import logging
import os

import gymnasium as gym
import numpy as np

from rlfarm.envs.registry import is_mujoco_spec, registered_spec


def headless_rendering() -> None:
    """Render without a display: MuJoCo through EGL, pygame through its dummy video driver (and without its
    banner). MuJoCo reads MUJOCO_GL once, when it is first imported (so does gymnasium's viewer, when it is
    made), so this must run before anything imports MuJoCo or renders: `make_env` and `VectorEnv` call it first
    thing, and a runner through them. Set here, not when rlfarm.envs is imported, so that importing the package
    changes nothing in the process's environment. A user's own setting wins."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")


def limit_software_rendering(threads: int) -> None:
    """Mesa's software rasteriser (llvmpipe, the EGL of a machine without a GPU driver) starts one render thread
    per core in every process that renders: dozens of runners on a many-core node would each start dozens.
    Give each rendering process its share of the runner's cores instead (Mesa reads it once per process; env
    worker processes inherit it). A user's own setting wins."""
    os.environ.setdefault("LP_NUM_THREADS", str(max(1, threads)))


def spread_rendering(index: int, render_gpus: list[int] | None = None) -> None:
    """Runners render headless through EGL; left alone, every runner draws on GPU 0 and it becomes the
    bottleneck (docs/benchmarks.md, split_1_3). Spread them over `render_gpus` (the driver's choice:
    rlfarm.topology.render_layout), or over all of the node's GPUs. Runners hold no CUDA share, so count the device
    files, not CUDA; a node without them renders in software (Mesa), whatever GPUs Ray was told it has.
    Call after `headless_rendering`."""
    if os.environ.get("MUJOCO_GL") != "egl" or "MUJOCO_EGL_DEVICE_ID" in os.environ:
        return
    devices = len(glob.glob("/dev/nvidia[0-9]*"))
    if devices:
        gpus = list(render_gpus or range(devices))
        os.environ["MUJOCO_EGL_DEVICE_ID"] = str(gpus[index % len(gpus)])


def make_env(env_id: str, frame_size: int | None = None, kwargs: dict | None = None) -> gym.Env:
    """One gymnasium env as VectorEnv builds its sub-envs: rendering `frame_size` frames (MuJoCo at that size,
    shadows and reflections off) when frame_size is set. Raises UnknownEnvError for an unregistered id."""
    headless_rendering()
    spec = registered_spec(env_id)
    make_kwargs = dict(kwargs or {})
    mujoco = is_mujoco_spec(spec)
    if mujoco:
        _log_mujoco_warnings()
    if frame_size is not None:
        make_kwargs["render_mode"] = "rgb_array"
        if mujoco:
            # Rendering at the target size directly is far cheaper than resizing a 480×480 frame.
            make_kwargs.update(width=frame_size, height=frame_size)
    env = gym.make(env_id, **make_kwargs)
    if mujoco and frame_size is not None:
        _turn_off_shadows_and_reflections(env.unwrapped.model)
    elif frame_size is not None and isinstance(getattr(env.unwrapped, "screen_dim", None), int):
        # Square pygame envs (Pendulum) draw at screen_dim (500) and are resized down: drawing at twice the
        # frame size keeps the antialiased look for a fraction of the cost (docs/benchmarks.md).
        env.unwrapped.screen_dim = min(env.unwrapped.screen_dim, 2 * frame_size)
    return env


def render_frame(env: gym.Env, size: int) -> np.ndarray:
    """[size, size, 3] uint8 frame of the env's current state (a view of the renderer's array or a resized copy)."""
    renderer = mujoco_renderer(env)
    if renderer is not None and renderer.viewer is not None:
        # Each sub-env owns a GL context and gymnasium leaves the last-created one current.
        renderer.viewer.make_context_current()
    frame = env.render()
    if frame.shape[:2] == (size, size):
        return frame
    return _resize(frame, size)


def mujoco_renderer(env: gym.Env):
    """gymnasium's MujocoRenderer of a MuJoCo env, or None for other envs."""
    return getattr(env.unwrapped, "mujoco_renderer", None)


def _resize(frame: np.ndarray, size: int) -> np.ndarray:
    """Area-aware downsampling keeps thin shapes (Pendulum's rod) visible at small sizes."""
    import torch
    import torch.nn.functional as F

    chw = torch.from_numpy(np.ascontiguousarray(frame)).permute(2, 0, 1)[None].float()
    resized = F.interpolate(chw, size=(size, size), mode="bilinear", antialias=True)
    return resized[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8).numpy()


def _turn_off_shadows_and_reflections(model) -> None:
    """Shadow maps and floor reflections dominate render time under software GL and carry no task signal.

    Must run before the first render: MuJoCo sizes the shadow buffer when it creates the render context.
    """
    model.vis.quality.shadowsize = 0
    model.mat_reflectance[:] = 0


def _log_mujoco_warnings() -> None:
    """Send MuJoCo's warnings to Python logging instead of MUJOCO_LOG.TXT in the working directory.

    HalfCheetah-v5's model warns on every load under MuJoCo 4. Process-wide; a handler already set wins.
    """
    import mujoco

    if mujoco.get_mju_user_warning() is None:
        mujoco.set_mju_user_warning(logging.getLogger("mujoco").warning)

"""The arrays a vector env writes its steps into (`StepBuffers`), preallocated for a whole chunk: plain arrays in
this process, or one file-backed shared memory mapping that the env's worker processes map too, so a step's
results (frames included) are written once, where the runner's chunk will read them."""
from __future__ import annotations

import logging
import mmap
import os
import tempfile
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

log = logging.getLogger(__name__)

_ALIGN = 64  # bytes: each shared array starts on a cache line


class NoRoomError(RuntimeError):
    """Neither /dev/shm nor the temp dir has room for a chunk's shared step buffers."""


@dataclass
class StepBuffers:
    """Preallocated arrays for `steps` vector steps of N sub-envs, written in place by VectorEnv.step_into.

    obs: [steps + 1, N, *obs_shape] float32 (uint8 for image observations): obs[t] is acted on at step t; step t writes obs[t + 1] (the reset
        obs where an episode ended), so obs[steps] is where the next chunk starts.
    action: [steps, N, *action_shape] (the action space's dtype), filled by the caller before step t.
    next_obs: [steps, N, *obs_shape] like obs, the true next observation (final obs at episode end).
    env_reward: [steps, N] float32. terminated, truncated: [steps, N] bool.
    frames: [steps, N, H, W, 3 * frame_stack] uint8 render of next_obs's state (after the frame_stack - 1 renders
        before it, oldest first), or None when the env renders no frames.
    key: names these arrays to the worker processes that map them (workers > 0).
    """

    obs: np.ndarray
    action: np.ndarray
    next_obs: np.ndarray
    env_reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    frames: np.ndarray | None
    key: int = 0


def buffer_specs(steps: int, n: int, obs_space: gym.Space, action_space: gym.Space,
                  frame_size: int | None, frame_stack: int = 1) -> dict[str, tuple[tuple[int, ...], str]]:
    """StepBuffers' arrays: name → (shape, dtype)."""
    obs_shape, action_shape = tuple(obs_space.shape), tuple(action_space.shape)
    # Images stay uint8 (an Atari step is 28 KB, not 113 KB, in every chunk); the networks scale them.
    obs_dtype = "uint8" if np.dtype(obs_space.dtype) == np.uint8 else "float32"
    specs = {
        "obs": ((steps + 1, n, *obs_shape), obs_dtype),
        "action": ((steps, n, *action_shape), np.dtype(action_space.dtype).str),
        "next_obs": ((steps, n, *obs_shape), obs_dtype),
        "env_reward": ((steps, n), "float32"),
        "terminated": ((steps, n), "bool"),
        "truncated": ((steps, n), "bool"),
    }
    if frame_size is not None:
        specs["frames"] = ((steps, n, frame_size, frame_size, 3 * frame_stack), "uint8")
    return specs


def shared_arrays(specs: dict) -> tuple[str, list, dict[str, np.ndarray]]:
    """Arrays in one file-backed shared mapping: (file path for the workers to map, layout, arrays)."""
    layout, size = [], 0
    for name, (shape, dtype) in specs.items():
        layout.append((name, shape, dtype, size))
        size += -(-int(np.prod(shape)) * np.dtype(dtype).itemsize // _ALIGN) * _ALIGN
    path = reserve_file(max(size, 1))
    return path, layout, map_arrays(path, layout)


def reserve_file(size: int) -> str:
    """A file of `size` bytes whose pages are reserved now: in /dev/shm (memory), or in the temp dir when
    /dev/shm is too small (a container's 64 MB default). Reserving up front turns a full /dev/shm into this
    fallback instead of a SIGBUS on some later write."""
    for directory in ("/dev/shm", tempfile.gettempdir()):
        if not os.path.isdir(directory):
            continue
        fd, path = tempfile.mkstemp(prefix="rlfarm-steps-", dir=directory)
        try:
            os.posix_fallocate(fd, 0, size)
            return path
        except OSError:
            os.unlink(path)
            log.warning(f"no room for {size / 2**20:.0f} MB of step buffers in {directory}; trying the next place")
        finally:
            os.close(fd)
    raise NoRoomError(f"no room for {size / 2**20:.0f} MB of shared step buffers in /dev/shm or the temp dir")


def map_arrays(path: str, layout: list) -> dict[str, np.ndarray]:
    with open(path, "r+b") as file:
        mapping = mmap.mmap(file.fileno(), 0)  # the arrays below keep it alive
    return {name: np.ndarray(shape, dtype, buffer=mapping, offset=offset) for name, shape, dtype, offset in layout}

"""Sub-envs stepped one after another in this process: the loop under a `VectorEnv`, in the runner's own process
(`workers=0`) or in each of its worker processes.

Autoreset: gymnasium 1.x vector envs autoreset one step *after* an episode ends by default (NEXT_STEP), which
turns the following step into a dummy transition. We reset in the same step instead (SAME_STEP): a done
sub-env's `next_obs` is its true final observation and its `obs` (what the policy acts on next) the reset
observation. We loop over plain gymnasium envs rather than use gymnasium's SyncVectorEnv: this loop writes each
result straight into its row of the caller's arrays, where SyncVectorEnv merges infos into new arrays every step
(the frames among them).

Frames (for pixel reward models) are rendered after every sub-env stepped and before the done ones reset, so
the frame of a done step shows the final state. With `frame_stack` k > 1 each transition's frames are the last k
renders of its sub-env, oldest first, stacked on the channels ([S, S, 3k]): the states before and after the step
for k = 2, what a reward that depends on motion (a velocity) must see; the reset state is rendered to start each
episode's history. Each frame is copied once, from the renderer into the caller's chunk array."""
from __future__ import annotations

import time

import gymnasium as gym
import numpy as np

from rlfarm.envs.rendering import make_env, mujoco_renderer, render_frame
from rlfarm.envs.step_buffers import StepBuffers
from rlfarm.envs.tiled_rendering import TiledRenderer


class SubEnvs:
    """Sub-envs first … first + count - 1 of a vector env, stepped one after another in this process. Each writes
    its own column of the StepBuffers: SAME_STEP autoreset, the frames rendered before the resets."""

    def __init__(self, env_id: str, first: int, count: int, seed: int, frame_size: int | None, kwargs: dict | None,
                 batch_render: bool = False, frame_stack: int = 1):
        self.envs = [make_env(env_id, frame_size, kwargs) for _ in range(count)]
        self.first, self.seed, self.frame_size = first, seed, frame_size
        tiled = batch_render and frame_size is not None and mujoco_renderer(self.envs[0]) is not None
        self.tiles = TiledRenderer(self.envs, frame_size) if tiled else None
        # frame_stack > 1: each sub-env's last frame_stack - 1 renders, oldest first ([count, k - 1, S, S, 3])
        stacked = frame_size is not None and frame_stack > 1
        self.history = np.zeros((count, frame_stack - 1, frame_size, frame_size, 3), np.uint8) if stacked else None
        self.episode_return = np.zeros(count, dtype=np.float64)
        self.episode_length = np.zeros(count, dtype=np.int64)
        self.render_s = 0.0

    def spaces(self) -> tuple[gym.Space, gym.Space]:
        return self.envs[0].observation_space, self.envs[0].action_space

    def reset(self, rows: StepBuffers) -> None:
        for j, env in enumerate(self.envs):
            obs, _ = env.reset(seed=self.seed + self.first + j)
            rows.obs[0, self.first + j] = obs
        self._start_history(np.arange(len(self.envs)))
        self.episode_return[:] = 0
        self.episode_length[:] = 0

    def step(self, rows: StepBuffers, t: int) -> tuple[list[float], list[int]]:
        """Step all, render all (final states), then reset the done ones."""
        columns = slice(self.first, self.first + len(self.envs))
        for j, env in enumerate(self.envs):
            i = self.first + j
            obs, reward, terminated, truncated, _ = env.step(rows.action[t, i])
            rows.next_obs[t, i] = rows.obs[t + 1, i] = obs
            rows.env_reward[t, i], rows.terminated[t, i], rows.truncated[t, i] = reward, terminated, truncated
            self.episode_return[j] += reward  # the env's float reward, not its float32 copy
        if rows.frames is not None:
            started = time.perf_counter()
            self._render_stacked(rows.frames[t, columns])
            self.render_s += time.perf_counter() - started
        self.episode_length += 1
        done = np.flatnonzero(rows.terminated[t, columns] | rows.truncated[t, columns])
        returns, lengths = [float(r) for r in self.episode_return[done]], [int(n) for n in self.episode_length[done]]
        self.episode_return[done], self.episode_length[done] = 0, 0
        for j in done:
            rows.obs[t + 1, self.first + j], _ = self.envs[j].reset()  # unseeded: the sub-env's own generator goes on
        self._start_history(done)
        return returns, lengths

    def _render_stacked(self, frames: np.ndarray) -> None:
        """frames [count, S, S, 3k]: the history, then this step's render; the history moves on by one."""
        if self.history is None:
            self._render(frames)
            return
        current = frames[..., -3:]
        self._render(current)
        frames[..., :-3] = self.history.transpose(0, 2, 3, 1, 4).reshape(*current.shape[:3], -1)
        self.history[:, :-1] = self.history[:, 1:]
        self.history[:, -1] = current

    def _start_history(self, which: np.ndarray) -> None:
        """Fill the history of the sub-envs `which` (just reset) with their reset state's frame."""
        if self.history is None or not len(which):
            return
        started = time.perf_counter()
        if self.tiles is not None:  # tiles draw every sub-env at once
            frames = np.empty((len(self.envs), self.frame_size, self.frame_size, 3), np.uint8)
            self.tiles.render(frames)
            self.history[which] = frames[which][:, None]
        else:
            for j in which:
                self.history[j] = render_frame(self.envs[j], self.frame_size)
        self.render_s += time.perf_counter() - started

    def _render(self, frames: np.ndarray) -> None:
        """frames [count, H, W, 3]: each sub-env's current state."""
        if self.tiles is not None:
            self.tiles.render(frames)
            return
        for j, env in enumerate(self.envs):
            frames[j] = render_frame(env, self.frame_size)

    def close(self) -> None:
        if self.tiles is not None:
            self.tiles.close()
            self.tiles = None
        for env in self.envs:
            env.close()
        self.envs = []  # a second close() has nothing left to close

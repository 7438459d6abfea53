"""A vector env that yields transitions safe to store in a replay buffer, written in place into preallocated
chunk arrays, with its sub-envs stepped in this process (`rlfarm.envs.sub_envs`) or in worker processes
(`rlfarm.envs.workers`).

The transitions (SAME_STEP autoreset: a done sub-env's `next_obs` is its final observation, its `obs` the reset
one) and the frames (rendered before the resets, `frame_stack` renders on the channels) are `SubEnvs`'s; batched
MuJoCo rendering is `rlfarm.envs.tiled_rendering`'s; env ids resolve through `rlfarm.envs.registry`.

Groups (`groups` > 1, Sample Factory's double buffering): the sub-envs are split into contiguous groups that can be
stepped one at a time (`begin_step` / `end_step`), so a runner computes one group's actions (on a GPU, without
waiting) while another group steps. With workers, each group has its own worker processes and `begin_step` only
sends the command; without, `begin_step` steps the group before it returns. A whole-env `step_into` steps every group.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from rlfarm.envs.registry import registered_spec
from rlfarm.envs.rendering import headless_rendering
from rlfarm.envs.step_buffers import StepBuffers, buffer_specs, shared_arrays
from rlfarm.envs.sub_envs import SubEnvs
from rlfarm.envs.workers import EnvWorkerError, Worker


@dataclass
class StepResult:
    """One vector step. N = num_envs.

    next_obs: [N, *obs_shape] float32, the true next observation of each transition (final obs at episode end).
    obs: [N, *obs_shape] float32, the observation to act on next (the reset obs where an episode ended).
    env_reward: [N] float32, the env's own reward.
    terminated, truncated: [N] bool.
    frames: [N, H, W, 3] uint8 render of the next_obs state, or None when the env renders no frames.
    episode_returns, episode_lengths: env-reward sum and length of each episode that ended this step.
    """

    next_obs: np.ndarray
    obs: np.ndarray
    env_reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    frames: np.ndarray | None
    episode_returns: list[float]
    episode_lengths: list[int]


class VectorEnv:
    """N gymnasium sub-envs that yield correct transitions (handles the autoreset trap), stepped in this process
    (workers=0) or by `workers` processes, each stepping a contiguous group of the sub-envs.

    env_id: a gymnasium id, optionally "module:Id" to import the registering module first.
    num_envs: sub-envs, seeded seed, seed + 1, ... (whatever `workers` is).
    frame_size: render a frame_size × frame_size RGB frame of every next state (None: no rendering).
    kwargs: passed to gymnasium.make (e.g. max_episode_steps).
    workers: processes stepping the sub-envs, 0 ≤ workers ≤ num_envs (0: this process).
    batch_render: MuJoCo sub-envs of a process render as tiles in one GL context, read back once per step (the
        same frames); other envs render one by one whatever it says.
    frame_stack: renders per frame (the last frame_stack of the sub-env, oldest first, on the channels).
    groups: contiguous groups of sub-envs that can be stepped apart (`begin_step(buffers, t, g)` / `end_step(g)`);
        with workers, each group has workers / groups of them.

    Two ways to step: `step(actions) -> StepResult` (fresh arrays each step), or `step_buffers(steps)` once and
    then `reset_into` / `step_into(buffers, t)`, which write row t of those arrays in place (the chunk path).
    """

    def __init__(self, env_id: str, num_envs: int = 1, seed: int = 0, frame_size: int | None = None,
                 kwargs: dict | None = None, workers: int = 0, batch_render: bool = False, frame_stack: int = 1,
                 groups: int = 1):
        headless_rendering()
        registered_spec(env_id)  # an unknown id fails here, in one line, before any worker starts
        if not 0 <= workers <= num_envs:
            raise ValueError(f"workers must be in [0, num_envs={num_envs}], got {workers}")
        if frame_stack < 1:
            raise ValueError(f"frame_stack must be >= 1, got {frame_stack}")
        if not 1 <= groups <= num_envs or workers % groups:
            raise ValueError(f"groups must be in [1, num_envs={num_envs}] and divide workers={workers}, got {groups}")
        self.num_envs, self.frame_size, self.frame_stack = num_envs, frame_size, frame_stack
        self._render_s = 0.0
        self._scratch: StepBuffers | None = None
        self._keys = 0
        # Group g: sub-envs columns[g]; stepped by locals[g] in this process, or by the worker processes workers[g].
        self.columns = [slice(int(c[0]), int(c[-1]) + 1) for c in np.array_split(np.arange(num_envs), groups)]
        self._locals: list[SubEnvs] = []
        self._workers: list[list[Worker]] = []
        self._begun: dict[int, tuple[list[float], list[int]] | None] = {}  # group → a step begun, not yet ended
        if workers == 0:
            self._locals = [SubEnvs(env_id, c.start, c.stop - c.start, seed, frame_size, kwargs, batch_render,
                                     frame_stack) for c in self.columns]
            spaces = self._locals[0].spaces()
        else:
            for c in self.columns:
                split = np.array_split(np.arange(c.start, c.stop), workers // groups)
                self._workers.append([Worker(env_id, int(g[0]), len(g), seed, frame_size, kwargs, batch_render,
                                              frame_stack) for g in split])
            try:  # all start at once; then wait for each
                spaces = [worker.wait_ready() for worker in self._all_workers][0]
            except EnvWorkerError:
                self.close()
                raise
        self.single_observation_space, self.single_action_space = spaces

    @property
    def groups(self) -> int:
        return len(self.columns)

    @property
    def steps_elsewhere(self) -> bool:
        """Worker processes step the sub-envs: `begin_step` returns at once and the step runs meanwhile."""
        return bool(self._workers)

    @property
    def _all_workers(self) -> list["Worker"]:
        return [worker for group in self._workers for worker in group]

    @property
    def render_s(self) -> float:
        """Seconds spent rendering so far (with workers: each step's mean over the worker processes, which run at
        once; without, the groups' sum)."""
        return sum(local.render_s for local in self._locals) if self._locals else self._render_s

    # -- the chunk path: rows written in place ------------------------------------------------------
    def step_buffers(self, steps: int) -> StepBuffers:
        """Arrays for `steps` vector steps (StepBuffers), in memory the workers share when there are any."""
        specs = buffer_specs(steps, self.num_envs, self.single_observation_space, self.single_action_space,
                              self.frame_size, self.frame_stack)
        self._keys += 1
        if not self._workers:
            arrays = {name: np.empty(shape, dtype) for name, (shape, dtype) in specs.items()}
        else:
            path, layout, arrays = shared_arrays(specs)
            try:
                self._call(self._all_workers, ("attach", self._keys, path, layout))
            finally:
                os.unlink(path)  # the mappings stay; the name goes, so nothing is left behind if this process dies
        return StepBuffers(**{"frames": None, **arrays}, key=self._keys)

    def reset_into(self, buffers: StepBuffers) -> None:
        """Reset every sub-env with its seed, writing buffers.obs[0]."""
        if self._begun:
            raise RuntimeError(f"groups {sorted(self._begun)} have a step begun and not ended")
        for local in self._locals:
            local.reset(buffers)
        if self._workers:
            self._call(self._all_workers, ("reset", buffers.key))

    def step_into(self, buffers: StepBuffers, t: int) -> tuple[list[float], list[int]]:
        """Step every sub-env with buffers.action[t]; write row t (obs: row t + 1). Done sub-envs are reset in the
        same call. Returns the env-reward sums and lengths of the episodes that ended, in sub-env order."""
        for group in range(self.groups):
            self.begin_step(buffers, t, group)
        ended = [self.end_step(group) for group in range(self.groups)]
        return [r for returns, _ in ended for r in returns], [n for _, lengths in ended for n in lengths]

    def begin_step(self, buffers: StepBuffers, t: int, group: int) -> None:
        """Step group `group`'s sub-envs (columns[group]) with buffers.action[t], as step_into does for all: with
        workers, only started here (its rows are written once `end_step(group)` returns); without, done here."""
        if group in self._begun:
            raise RuntimeError(f"group {group} has a step begun and not ended")
        if self._locals:
            self._begun[group] = self._locals[group].step(buffers, t)
            return
        for worker in self._workers[group]:
            worker.send(("step", buffers.key, t))
        self._begun[group] = None

    def stepping(self, group: int) -> bool:
        """The group has a step begun and not ended."""
        return group in self._begun

    def end_step(self, group: int) -> tuple[list[float], list[int]]:
        """Wait for the group's step begun last; returns its finished episodes (returns, lengths), in sub-env order."""
        done = self._begun.pop(group)
        if self._locals:
            return done
        replies = [worker.receive() for worker in self._workers[group]]
        self._render_s += sum(render_s for _, _, render_s in replies) / len(replies) / self.groups
        return ([r for returns, _, _ in replies for r in returns],
                [n for _, lengths, _ in replies for n in lengths])

    # -- one step at a time -------------------------------------------------------------------------
    def reset(self) -> np.ndarray:
        """Reset every sub-env with its seed. Returns obs [num_envs, *obs_shape] float32."""
        if self._scratch is None:
            self._scratch = self.step_buffers(1)
        self.reset_into(self._scratch)
        return self._scratch.obs[0].copy()

    def step(self, actions: np.ndarray) -> StepResult:
        """Step every sub-env with actions [num_envs, *action_shape]; done sub-envs are reset in the same call."""
        if self._scratch is None:
            raise RuntimeError("VectorEnv.reset() must come before step()")
        rows = self._scratch
        rows.action[0] = actions
        returns, lengths = self.step_into(rows, 0)
        return StepResult(next_obs=rows.next_obs[0].copy(), obs=rows.obs[1].copy(),
                          env_reward=rows.env_reward[0].copy(), terminated=rows.terminated[0].copy(),
                          truncated=rows.truncated[0].copy(),
                          frames=None if rows.frames is None else rows.frames[0].copy(),
                          episode_returns=returns, episode_lengths=lengths)

    def close(self) -> None:
        for local in self._locals:
            local.close()
        for worker in self._all_workers:
            worker.close()
        self._workers = []

    @staticmethod
    def _call(workers: list["Worker"], message: tuple) -> list:
        """Send `message` to these workers, then gather their replies (they work at once)."""
        for worker in workers:
            worker.send(message)
        return [worker.receive() for worker in workers]

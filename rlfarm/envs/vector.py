"""A vector env that yields transitions safe to store in a replay buffer, written in place into preallocated
chunk arrays, with its sub-envs stepped in this process or in worker processes.

Autoreset: gymnasium 1.x vector envs autoreset one step *after* an episode ends by default (NEXT_STEP), which
turns the following step into a dummy transition. We reset in the same step instead (SAME_STEP): a done
sub-env's `next_obs` is its true final observation and its `obs` (what the policy acts on next) the reset
observation. The sub-envs are stepped by `_SubEnvs` below, a loop over plain gymnasium envs, rather than by
gymnasium's SyncVectorEnv: that loop can write each result straight into its row of the caller's arrays,
where SyncVectorEnv merges infos into new arrays every step (the frames among them).

Frames (for pixel reward models) are rendered after every sub-env stepped and before the done ones reset, so
the frame of a done step shows the final state. With `frame_stack` k > 1 each transition's frames are the last k
renders of its sub-env, oldest first, stacked on the channels ([S, S, 3k]): the states before and after the step
for k = 2, what a reward that depends on motion (a velocity) must see; the reset state is rendered to start each
episode's history. MuJoCo renders at `frame_size` directly; classic-control envs
render with pygame (square ones at twice `frame_size`) and are resized. Each frame is copied once, from the renderer into the caller's chunk array.
Batched rendering (`batch_render`, MuJoCo only): gymnasium gives each sub-env its own GL context and reads its
RGB and depth back after every frame, so a GPU switches between a dozen contexts per frame. `_TiledRenderer`
instead draws all of a process's sub-envs as tiles of one offscreen buffer in one GL context, with gymnasium's
cameras, and reads the RGB back once per vector step.

Worker processes (`workers` > 0): the sub-envs are split into `workers` contiguous groups, each stepped by a
`_SubEnvs` in its own process, writing into the same arrays through a shared memory mapping; only a short
command ("step row t") and each group's finished episodes travel through a pipe. So a runner uses several
cores, the transitions are those of `workers=0` (same code, same seeds), and frames never get pickled. We do
not use gymnasium's AsyncVectorEnv: it ties one process to each sub-env (a runner of 16 sub-envs on 4 cores
would start 16 processes), copies observations out of its shared memory again on every step, and sends the
final observation and info of a done sub-env through its pipe anyway. Here `num_envs` (the batch of one policy
forward) and `workers` (the cores) are set apart, as in EnvPool. Workers are started with `python -c`, not
multiprocessing: a runner is a threaded Ray actor (fork is unsafe there) and multiprocessing's spawn would
re-import the Ray worker's main module in every worker.

Groups (`groups` > 1, Sample Factory's double buffering): the sub-envs are split into contiguous groups that can be
stepped one at a time (`begin_step` / `end_step`), so a runner computes one group's actions (on a GPU, without
waiting) while another group steps. With workers, each group has its own worker processes and `begin_step` only
sends the command; without, `begin_step` steps the group before it returns. A whole-env `step_into` steps every group.

Headless rendering: MuJoCo uses EGL (`MUJOCO_GL=egl` unless set) with shadows and reflections off;
classic-control envs use pygame's dummy video driver. Rates are in docs/benchmarks.md (`rlfarm bench env`).
"""

import difflib
import importlib
import logging
import mmap
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection

# Headless defaults, set before gymnasium/mujoco/pygame look at them. A user's own setting wins.
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
from gymnasium.envs.registration import load_env_creator  # noqa: E402

log = logging.getLogger(__name__)

WORKER_START_TIMEOUT_S = 120  # importing gymnasium + MuJoCo and building the envs; far above what it takes
_ALIGN = 64  # bytes: each shared array starts on a cache line


class UnknownEnvError(ValueError):
    """An env id that gymnasium's registry does not know."""


class EnvWorkerError(RuntimeError):
    """A worker process stepping a group of sub-envs failed or exited."""


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


# The arrays of StepBuffers: what a chunk can carry.
RECORDED = ("obs", "action", "next_obs", "env_reward", "terminated", "truncated", "frames")


def make_env(env_id: str, frame_size: int | None = None, kwargs: dict | None = None) -> gym.Env:
    """One gymnasium env as VectorEnv builds its sub-envs: rendering `frame_size` frames (MuJoCo at that size,
    shadows and reflections off) when frame_size is set. Raises UnknownEnvError for an unregistered id."""
    spec = _registered_spec(env_id)
    make_kwargs = dict(kwargs or {})
    mujoco = _is_mujoco(spec)
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
    renderer = _mujoco_renderer(env)
    if renderer is not None and renderer.viewer is not None:
        # Each sub-env owns a GL context and gymnasium leaves the last-created one current.
        renderer.viewer.make_context_current()
    frame = env.render()
    if frame.shape[:2] == (size, size):
        return frame
    return _resize(frame, size)


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
        _registered_spec(env_id)  # an unknown id fails here, in one line, before any worker starts
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
        self._locals: list[_SubEnvs] = []
        self._workers: list[list[_Worker]] = []
        self._begun: dict[int, tuple[list[float], list[int]] | None] = {}  # group → a step begun, not yet ended
        if workers == 0:
            self._locals = [_SubEnvs(env_id, c.start, c.stop - c.start, seed, frame_size, kwargs, batch_render,
                                     frame_stack) for c in self.columns]
            spaces = self._locals[0].spaces()
        else:
            for c in self.columns:
                split = np.array_split(np.arange(c.start, c.stop), workers // groups)
                self._workers.append([_Worker(env_id, int(g[0]), len(g), seed, frame_size, kwargs, batch_render,
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
    def _all_workers(self) -> list["_Worker"]:
        return [worker for group in self._workers for worker in group]

    @property
    def render_s(self) -> float:
        """Seconds spent rendering so far (with workers: each step's mean over the worker processes, which run at
        once; without, the groups' sum)."""
        return sum(local.render_s for local in self._locals) if self._locals else self._render_s

    # -- the chunk path: rows written in place ------------------------------------------------------
    def step_buffers(self, steps: int) -> StepBuffers:
        """Arrays for `steps` vector steps (StepBuffers), in memory the workers share when there are any."""
        specs = _buffer_specs(steps, self.num_envs, self.single_observation_space, self.single_action_space,
                              self.frame_size, self.frame_stack)
        self._keys += 1
        if not self._workers:
            arrays = {name: np.empty(shape, dtype) for name, (shape, dtype) in specs.items()}
        else:
            path, layout, arrays = _shared_arrays(specs)
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
    def _call(workers: list["_Worker"], message: tuple) -> list:
        """Send `message` to these workers, then gather their replies (they work at once)."""
        for worker in workers:
            worker.send(message)
        return [worker.receive() for worker in workers]


class _SubEnvs:
    """Sub-envs first … first + count - 1 of a vector env, stepped one after another in this process. Each writes
    its own column of the StepBuffers: SAME_STEP autoreset, the frames rendered before the resets."""

    def __init__(self, env_id: str, first: int, count: int, seed: int, frame_size: int | None, kwargs: dict | None,
                 batch_render: bool = False, frame_stack: int = 1):
        self.envs = [make_env(env_id, frame_size, kwargs) for _ in range(count)]
        self.first, self.seed, self.frame_size = first, seed, frame_size
        tiled = batch_render and frame_size is not None and _mujoco_renderer(self.envs[0]) is not None
        self.tiles = _TiledRenderer(self.envs, frame_size) if tiled else None
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


# -- worker processes -----------------------------------------------------------------------------------------
class _Worker:
    """The parent's handle on one worker process stepping a group of sub-envs (`serve_worker` on the other end).

    Started with `python -c` over a socket pair; when the parent dies, the socket closes and the worker exits."""

    def __init__(self, env_id: str, first: int, count: int, seed: int, frame_size: int | None, kwargs: dict | None,
                 batch_render: bool, frame_stack: int = 1):
        self.first, self.count = first, count
        ours, theirs = socket.socketpair()
        # The parent's import path travels along, so "module:Id" env ids resolve in the worker as they do here.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.process = subprocess.Popen(
            [sys.executable, "-c", "import sys; from rlfarm.envs.vector import serve_worker; serve_worker(int(sys.argv[1]))",
             str(theirs.fileno())], pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL)
        theirs.close()
        self.conn = Connection(ours.detach())
        self.conn.send(("init", env_id, first, count, seed, frame_size, dict(kwargs or {}), batch_render, frame_stack))

    def wait_ready(self) -> tuple[gym.Space, gym.Space]:
        if not self.conn.poll(WORKER_START_TIMEOUT_S):
            self.close()
            raise EnvWorkerError(f"env worker for sub-envs {self._range()} did not start in {WORKER_START_TIMEOUT_S} s")
        return self.receive()

    def send(self, message: tuple) -> None:
        try:
            self.conn.send(message)
        except OSError as error:
            raise self._exited() from error

    def receive(self):
        try:
            status, payload = self.conn.recv()
        except (EOFError, OSError) as error:
            raise self._exited() from error
        if status == "error":
            raise EnvWorkerError(f"env worker for sub-envs {self._range()} failed: {payload}")
        return payload

    def _exited(self) -> EnvWorkerError:
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = "none yet"
        return EnvWorkerError(f"env worker for sub-envs {self._range()} exited (code {code})")

    def close(self) -> None:
        try:
            self.conn.send(("close",))
        except OSError:
            pass
        self.conn.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _range(self) -> str:
        return f"{self.first}..{self.first + self.count - 1}"


def serve_worker(fd: int) -> None:
    """A worker process's loop: build the group of sub-envs, then answer the parent's commands until it says
    close or goes away. Each reply is ("ok", payload) or ("error", the exception's last traceback line)."""
    conn = Connection(fd)
    group: _SubEnvs | None = None
    buffers: dict[int, StepBuffers] = {}
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            break  # the parent is gone
        command, args = message[0], message[1:]
        if command == "close":
            break
        try:
            if command == "init":
                group = _SubEnvs(*args)
                reply = group.spaces()
            elif command == "attach":
                key, path, layout = args
                buffers[key] = StepBuffers(**{"frames": None, **_map_arrays(path, layout)}, key=key)
                reply = None
            elif command == "reset":
                group.reset(buffers[args[0]])
                reply = None
            elif command == "step":
                render_before = group.render_s
                returns, lengths = group.step(buffers[args[0]], args[1])
                reply = (returns, lengths, group.render_s - render_before)
            else:
                raise ValueError(f"unknown command {command!r}")
            conn.send(("ok", reply))
        except Exception as error:  # noqa: BLE001 - reported to the parent, which raises it there
            last = traceback.format_exception_only(type(error), error)[-1].strip()
            conn.send(("error", last))
    if group is not None:
        group.close()


# -- shared arrays ------------------------------------------------------------------------------------------
def _buffer_specs(steps: int, n: int, obs_space: gym.Space, action_space: gym.Space,
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


def _shared_arrays(specs: dict) -> tuple[str, list, dict[str, np.ndarray]]:
    """Arrays in one file-backed shared mapping: (file path for the workers to map, layout, arrays)."""
    layout, size = [], 0
    for name, (shape, dtype) in specs.items():
        layout.append((name, shape, dtype, size))
        size += -(-int(np.prod(shape)) * np.dtype(dtype).itemsize // _ALIGN) * _ALIGN
    path = _reserve_file(max(size, 1))
    return path, layout, _map_arrays(path, layout)


def _reserve_file(size: int) -> str:
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
    raise EnvWorkerError(f"no room for {size / 2**20:.0f} MB of shared step buffers in /dev/shm or the temp dir")


def _map_arrays(path: str, layout: list) -> dict[str, np.ndarray]:
    with open(path, "r+b") as file:
        mapping = mmap.mmap(file.fileno(), 0)  # the arrays below keep it alive
    return {name: np.ndarray(shape, dtype, buffer=mapping, offset=offset) for name, shape, dtype, offset in layout}


# -- batched MuJoCo rendering ----------------------------------------------------------------------------------
class _TiledRenderer:
    """MuJoCo sub-envs (one env id) drawn as tiles of one offscreen buffer in one GL context: per vector step one
    scene update and draw per sub-env, then one read of the RGB pixels (no depth) for all of them.

    The cameras are those gymnasium's OffScreenViewer sets up (`_gymnasium_camera`), created at the first render
    as gymnasium creates its viewer, so the frames are the per-env path's. One MjrContext (textures, meshes)
    serves every sub-env: their models are separate objects of equal content, built from the same env id."""

    def __init__(self, envs: list[gym.Env], size: int):
        import mujoco

        self.mujoco, self.size = mujoco, size
        self.models = [env.unwrapped.model for env in envs]
        self.datas = [env.unwrapped.data for env in envs]
        self.renderers = [_mujoco_renderer(env) for env in envs]
        _check_same_layout(self.models)
        self.columns = int(np.ceil(np.sqrt(len(envs))))
        tile_rows = -(-len(envs) // self.columns)
        width, height = self.columns * size, tile_rows * size
        model = self.models[0]
        # The offscreen buffer is sized from the model when the MjrContext is made.
        model.vis.global_.offwidth = max(model.vis.global_.offwidth, width)
        model.vis.global_.offheight = max(model.vis.global_.offheight, height)
        # The context is current only while in use (as_current): a threaded Ray actor builds its env on one
        # thread and steps it on another, and EGL refuses a context still current on a different thread.
        self.gl = mujoco.GLContext(width, height)
        with self.gl.as_current():
            self.context = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150)
            mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self.context)
        first = self.renderers[0]
        self.scene = mujoco.MjvScene(model, first.max_geom)  # filled and drawn per sub-env in turn
        self.option, self.perturb = mujoco.MjvOption(), mujoco.MjvPerturb()
        for flag, value in first._vopt.items():
            self.option.flags[flag] = value
        self.cameras: list | None = None
        self.viewport = mujoco.MjrRect(0, 0, width, height)
        self.pixels = np.empty((height, width, 3), np.uint8)

    def render(self, frames: np.ndarray) -> None:
        """Write frames [count, size, size, 3] of the sub-envs' current states."""
        mujoco, size = self.mujoco, self.size
        if self.cameras is None:
            self.cameras = [_gymnasium_camera(r, m, d) for r, m, d in zip(self.renderers, self.models, self.datas)]
        with self.gl.as_current():
            for j, (model, data, camera) in enumerate(zip(self.models, self.datas, self.cameras)):
                mujoco.mjv_updateScene(model, data, self.option, self.perturb, camera, mujoco.mjtCatBit.mjCAT_ALL,
                                       self.scene)
                mujoco.mjr_render(mujoco.MjrRect(*self._origin(j), size, size), self.scene, self.context)
            mujoco.mjr_readPixels(self.pixels, None, self.viewport, self.context)
        for j in range(len(frames)):
            x, y = self._origin(j)
            frames[j] = self.pixels[y : y + size, x : x + size][::-1]  # OpenGL's rows go bottom-up

    def _origin(self, j: int) -> tuple[int, int]:
        """Bottom-left pixel of tile j."""
        return (j % self.columns) * self.size, (j // self.columns) * self.size

    def close(self) -> None:
        with self.gl.as_current():
            self.context.free()
        self.gl.free()


def _gymnasium_camera(renderer, model, data):
    """The MjvCamera gymnasium's MujocoRenderer renders an env's rgb_array frames with: OffScreenViewer's free
    camera looking at the median geom position, then the env's default_camera_config, then its camera id."""
    import mujoco

    camera = mujoco.MjvCamera()
    camera.type, camera.fixedcamid = mujoco.mjtCamera.mjCAMERA_FREE, -1
    camera.lookat[:] = np.median(data.geom_xpos, axis=0)
    camera.distance = model.stat.extent
    for key, value in (renderer.default_cam_config or {}).items():
        if isinstance(value, np.ndarray):
            getattr(camera, key)[:] = value
        else:
            setattr(camera, key, value)
    if renderer.camera_id is not None:
        fixed = renderer.camera_id != -1
        camera.type = mujoco.mjtCamera.mjCAMERA_FIXED if fixed else mujoco.mjtCamera.mjCAMERA_FREE
        camera.fixedcamid = renderer.camera_id
    return camera


def _check_same_layout(models: list) -> None:
    """One MjrContext draws every model: they must be the same model (one env id and kwargs)."""
    fields = ("nbody", "ngeom", "nmesh", "nmat", "ntex", "nskin", "nflex", "ncam", "nlight", "nhfield")
    first = {field: getattr(models[0], field) for field in fields}
    for model in models[1:]:
        other = {field: getattr(model, field) for field in fields}
        if other != first:
            raise ValueError(f"batch_render needs sub-envs of one model layout: {first} vs {other}")


def is_mujoco(env_id: str) -> bool:
    """Whether env_id is a MuJoCo env (what batch_render applies to), without importing MuJoCo otherwise."""
    return _is_mujoco(_registered_spec(env_id))


def _mujoco_renderer(env: gym.Env):
    """gymnasium's MujocoRenderer of a MuJoCo env, or None for other envs."""
    return getattr(env.unwrapped, "mujoco_renderer", None)


# -- rendering and registry helpers -------------------------------------------------------------------------
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


def _registered_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    """The registry entry for env_id, or UnknownEnvError naming the closest registered ids."""
    module, _, name = env_id.rpartition(":")
    if module:
        importlib.import_module(module)
    if name in gym.registry:
        return gym.registry[name]
    closest = difflib.get_close_matches(name, list(gym.registry), n=3, cutoff=0.5)
    hint = f" (closest: {', '.join(closest)})" if closest else ""
    raise UnknownEnvError(
        f"unknown env id {env_id!r}{hint}; use env=pendulum|halfcheetah or env.id=<gymnasium id>"
    )


def _is_mujoco(spec: gym.envs.registration.EnvSpec) -> bool:
    creator = spec.entry_point
    if isinstance(creator, str) and "mujoco" not in creator.lower():
        return False  # importing MuJoCo loads its GL backend (EGL): not for envs that do not need it
    if not isinstance(creator, (str, type)):
        return False  # a factory function: not one of gymnasium's MuJoCo env classes
    from gymnasium.envs.mujoco.mujoco_env import MujocoEnv

    if isinstance(creator, str):
        creator = load_env_creator(creator)
    return isinstance(creator, type) and issubclass(creator, MujocoEnv)

"""Worker processes stepping groups of a vector env's sub-envs (`env.workers` > 0).

The sub-envs are split into `workers` contiguous groups, each stepped by a `SubEnvs` in its own process, writing
into the runner's step buffers through a shared memory mapping; only a short command ("step row t") and each
group's finished episodes travel through a pipe. So a runner uses several cores, the transitions are those of
`workers=0` (same code, same seeds), and frames never get pickled. We do not use gymnasium's AsyncVectorEnv: it
ties one process to each sub-env (a runner of 16 sub-envs on 4 cores would start 16 processes), copies
observations out of its shared memory again on every step, and sends the final observation and info of a done
sub-env through its pipe anyway. Here `num_envs` (the batch of one policy forward) and `workers` (the cores) are
set apart, as in EnvPool. Workers are started with `python -c`, not multiprocessing: a runner is a threaded Ray
actor (fork is unsafe there) and multiprocessing's spawn would re-import the Ray worker's main module in every
worker."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import traceback
from multiprocessing.connection import Connection

import gymnasium as gym

from rlfarm.envs.step_buffers import StepBuffers, map_arrays
from rlfarm.envs.sub_envs import SubEnvs

WORKER_START_TIMEOUT_S = 120  # importing gymnasium + MuJoCo and building the envs; far above what it takes


class EnvWorkerError(RuntimeError):
    """A worker process stepping a group of sub-envs failed or exited."""


class Worker:
    """The parent's handle on one worker process stepping a group of sub-envs (`serve_worker` on the other end).

    Started with `python -c` over a socket pair; when the parent dies, the socket closes and the worker exits."""

    def __init__(self, env_id: str, first: int, count: int, seed: int, frame_size: int | None, kwargs: dict | None,
                 batch_render: bool, frame_stack: int = 1):
        self.first, self.count = first, count
        ours, theirs = socket.socketpair()
        # The parent's import path travels along, so "module:Id" env ids resolve in the worker as they do here.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.process = subprocess.Popen(
            [sys.executable, "-c", "import sys; from rlfarm.envs.workers import serve_worker; serve_worker(int(sys.argv[1]))",
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
    group: SubEnvs | None = None
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
                group = SubEnvs(*args)
                reply = group.spaces()
            elif command == "attach":
                key, path, layout = args
                buffers[key] = StepBuffers(**{"frames": None, **map_arrays(path, layout)}, key=key)
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

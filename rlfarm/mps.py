"""NVIDIA MPS for a run (`topology.mps=true`): the run starts a private MPS control daemon before Ray, the labelers
(the processes that share the reward GPUs) become its clients, and the daemon is told to quit when the run ends,
however it ends.

Why: processes that share a GPU without MPS take turns on it in time slices (each its own context), so two labelers
on one reward GPU cannot overlap their kernels; under MPS their work runs on the GPU at the same time, as one
context's would. EGL renderers are not CUDA clients: MPS does not change how they share. The learner stays outside:
it has its GPU to itself, and a SAC learner lives on launch latency (in the one run where every GPU process of the run
was a client, 2x H200 2026-11-30, its updates ran at 1,371/s with its GPU 45 % busy, about half its bench; not
measured apart from other causes). Only the labeling farm's labelers are clients (rlfarm/loops/roles.py; a family's
`mps_clients`); the other families refuse the option with their plan (`Family.check_plan`), since no role of
theirs would use the daemon.

The daemon is the run's own: its pipe directory (a fresh one under the temp dir: the pipes' paths must stay short)
is handed to the labelers through their environment (CUDA_MPS_PIPE_DIRECTORY), so it serves this run's processes and
no one else's, and quitting it does not touch another user's daemon; its log is the run directory's `mps/`. Only a
private local cluster can do this: on a cluster joined at ray.address the workers' environment is the nodes', so the
check refuses it with the fix (start MPS on every node).
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from omegaconf import DictConfig

from rlfarm.errors import ConfigError

CONTROL = "nvidia-cuda-mps-control"
START_TIMEOUT_S = 10.0  # the daemon creates its control pipe within milliseconds; a hung start is a broken driver
QUIT_TIMEOUT_S = 10.0
PIPE_ENV, LOG_ENV = "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"
OFF = "or set topology.mps=false"

log = logging.getLogger("rlfarm")
_clients: dict[str, str] = {}  # while this process's run has a daemon: the environment that makes a process its client


def wants_mps(cfg: DictConfig) -> bool:
    return bool(cfg.topology.get("mps", False))


def check_mps(cfg: DictConfig) -> None:
    """Before anything starts (preflight): a run can start its own daemon. ConfigError (one line) otherwise."""
    if not wants_mps(cfg):
        return
    if cfg.ray.get("address"):
        raise ConfigError(f"topology.mps=true starts an MPS daemon for a private local cluster, not for one joined at "
                          f"ray.address={cfg.ray.address}",
                          f"start `{CONTROL} -d` on every node before `ray start`, {OFF}")
    if shutil.which(CONTROL) is None:
        raise ConfigError(f"topology.mps=true needs NVIDIA's MPS control program ({CONTROL}), which is not on PATH",
                          f"install the NVIDIA driver's utilities, {OFF}")


@contextmanager
def mps_daemon(cfg: DictConfig, run_dir: str | os.PathLike):
    """While open: this run's MPS daemon runs, and roles started with `client_options()` are its clients. Nothing
    when topology.mps is false."""
    if not wants_mps(cfg):
        yield None
        return
    check_mps(cfg)
    pipe, logs = Path(tempfile.mkdtemp(prefix="rlfarm-mps-")), Path(run_dir) / "mps"
    logs.mkdir(parents=True, exist_ok=True)
    env = {PIPE_ENV: str(pipe), LOG_ENV: str(logs)}
    try:
        _start(env, pipe, logs)
    except BaseException:  # a failed start, or Ctrl-C during one: a daemon that came up after all is told to quit
        _stop(env, pipe)
        raise
    _clients.update(env)
    log.info("MPS daemon started (pipe %s): the labelers are its clients", pipe)
    try:
        yield pipe
    finally:
        _clients.clear()
        _stop(env, pipe)


def _stop(env: dict, pipe: Path) -> None:
    """Quit the daemon where its control pipe is, and remove the pipe directory unless a daemon still listens there
    (the warning's command needs it)."""
    if not (pipe / "control").exists() or _quit(env, pipe):
        shutil.rmtree(pipe, ignore_errors=True)


def client_options() -> dict:
    """Ray actor options that make a role a client of the run's daemon ({} when there is none). Ray merges an actor's
    env_vars into the run's own (rlfarm.cluster's FORWARDED_ENV), key by key."""
    return {"runtime_env": {"env_vars": dict(_clients)}} if _clients else {}


def _start(env: dict, pipe: Path, logs: Path) -> None:
    try:
        started = subprocess.run([CONTROL, "-d"], env={**os.environ, **env}, capture_output=True, text=True,
                                 timeout=START_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ConfigError(f"the MPS daemon did not start ({error})", f"{_kept_log(logs)}{OFF}") from None
    deadline = time.monotonic() + START_TIMEOUT_S
    while started.returncode == 0 and not (pipe / "control").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if started.returncode != 0 or not (pipe / "control").exists():
        said = (started.stderr or started.stdout or "").strip().splitlines()
        reason = said[-1] if said else _last_log_line(logs) or f"exit {started.returncode}, no control pipe"
        raise ConfigError(f"the MPS daemon did not start: {reason}", f"{_kept_log(logs)}it needs the GPU driver and "
                          f"may need root; {OFF}")


def _quit(env: dict, pipe: Path) -> bool:
    """Ask the daemon to quit (it ends once its clients have); whether it took the command. A daemon that will not
    leaves a warning, not a failed run."""
    try:
        answer = subprocess.run([CONTROL], input="quit\n", env={**os.environ, **env}, capture_output=True, text=True,
                                timeout=QUIT_TIMEOUT_S)
        said = (answer.stderr or answer.stdout).strip()
        problem = None if answer.returncode == 0 else said or f"exit {answer.returncode}"
    except (OSError, subprocess.TimeoutExpired) as error:
        problem = str(error)
    if problem is not None:
        log.warning("the MPS daemon of %s did not take `quit` (%s); stop it with: echo quit | %s=%s %s",
                    pipe, problem, PIPE_ENV, pipe, CONTROL)
    return problem is None


def _kept_log(logs: Path) -> str:
    """"see <file>; " for a copy of the daemon's log outside the run directory (a run that cannot start is discarded
    with its directory), or "" when it wrote none."""
    control_log = logs / "control.log"
    if not control_log.exists():
        return ""
    handle, kept = tempfile.mkstemp(prefix="rlfarm-mps-control-", suffix=".log")
    os.close(handle)
    shutil.copyfile(control_log, kept)
    return f"see {kept}; "


def _last_log_line(logs: Path) -> str | None:
    control_log = logs / "control.log"
    if not control_log.exists():
        return None
    lines = [line.strip() for line in control_log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else None

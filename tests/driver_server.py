"""The tests' `rlfarm` command, started as a fork of a warm server instead of a fresh `python -m rlfarm.cli`.

A run's driver spends ~4.5 CPU-s importing torch, Ray, Hydra and rlfarm before it reads its first override: on
the 2-core CI, ~190 runs pay that. Here one server per test process (multiprocessing's forkserver) imports them
once (tests/driver_warmup.py), and each command is a fork of it that then behaves as `python -m rlfarm.cli
<args>` started by subprocess would: its own process (and session, for `start`), its own argv, working directory
and environment (the current directory first on sys.path, as `-m` puts it), stdin from /dev/null, stdout and
stderr captured, and its exit status (negative: the signal that ended it). The forked server is single-threaded
and has started nothing (no Ray, no thread pool, no gRPC channel), so the fork carries no half-held lock.

What a fork cannot take over: settings a native library reads once when it loads (OMP_NUM_THREADS for torch's
OpenMP pool) come from the server's environment; a run's Ray workers are fresh processes and read the run's.
Tests that need the real executable (a terminal, the installed script, Slurm jobs) keep `subprocess`.
"""
from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path

_CONTEXT = None


def _context():
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(["driver_warmup"])
    return _CONTEXT


def _serve(argv: list[str], cwd: str, env: dict[str, str], out: str, err: str, new_session: bool) -> None:
    """In the fork: become `python -m rlfarm.cli <argv>` and run it (cli.run ends the process)."""
    if new_session:
        os.setsid()
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as a fresh Python sets them: Ctrl-C is
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # KeyboardInterrupt, a broken pipe an error rather than a signal
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    # line-buffered, as PYTHONUNBUFFERED asks of the tests; UTF-8, as Python's own streams are on these machines
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", closefd=False)
    import rlfarm.cli

    sys.argv = [rlfarm.cli.__file__, *argv]
    sys.path.insert(0, cwd)
    rlfarm.cli.run()


class _Output:
    """`proc.stdout` / `proc.stderr`: what the command wrote so far (read() gives all of it)."""

    def __init__(self, path: Path):
        self.path = path

    def read(self) -> str:
        return self.path.read_text(encoding="utf-8", errors="replace") if self.path.exists() else ""


class Driver:
    """The subset of subprocess.Popen the tests use, for a command forked from the warm server."""

    def __init__(self, argv: list[str], cwd=None, env=None, new_session: bool = False):
        self.args = ["rlfarm", *argv]
        self._folder = Path(tempfile.mkdtemp(prefix="rlfarm-driver-"))
        out, err = self._folder / "stdout", self._folder / "stderr"
        self.stdout, self.stderr = _Output(out), _Output(err)
        self._process = _context().Process(
            target=_serve, args=(list(argv), str(cwd or os.getcwd()), dict(env if env is not None else os.environ),
                                 str(out), str(err), new_session))
        self._process.start()
        # A command a test leaves running must not hold up the test process's exit (multiprocessing joins the
        # children it knows at exit; subprocess leaves them be): it goes on, as a Popen's would.
        multiprocessing.process._children.discard(self._process)  # noqa: SLF001
        weakref.finalize(self, shutil.rmtree, self._folder, True)
        self.pid = self._process.pid
        self.returncode = None

    def poll(self):
        if self.returncode is None and self._process.exitcode is not None:
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        return self.stdout.read(), self.stderr.read()

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def run(argv: list[str], cwd=None, env=None, timeout: float | None = None) -> subprocess.CompletedProcess:
    """subprocess.run(..., capture_output=True, text=True) for the command: on timeout the command is killed and
    TimeoutExpired raised, as subprocess.run does."""
    driver = Driver(argv, cwd=cwd, env=env)
    try:
        stdout, stderr = driver.communicate(timeout)
    except subprocess.TimeoutExpired:
        driver.kill()
        driver.wait(30)
        raise
    return subprocess.CompletedProcess(driver.args, driver.returncode, stdout, stderr)


"""A real one-node Slurm (munged + slurmctld + slurmd on 127.0.0.1) for tests/slurm, once per session.

`scripts/slurm_local.sh start` does the work (installs slurm-wlm and munge with apt-get when missing, writes
slurm.conf with this machine's CPU count, starts the daemons, waits for the node to be idle); this fixture
only calls it with a bound on every step and always calls `stop` at teardown. Not root → the tests skip
with the reason (installing and running slurmd needs root). A start that fails as root is an error, not a
skip: CI must not turn a broken set-up green.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "slurm_local.sh"
STATE_DIR = Path(os.environ.get("RLFARM_SLURM_DIR", "/tmp/rlfarm-slurm"))
START_TIMEOUT_S = 900   # apt-get update + install on a fresh machine is ~30 s; a slow mirror gets room
STOP_TIMEOUT_S = 120


@dataclass
class SlurmCluster:
    """The private cluster: `env` is what a Slurm command (and the jobs it submits) should run with."""
    conf: Path
    env: dict = field(default_factory=dict)

    def run(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout)

    def job_ids(self) -> list[str]:
        out = self.run("squeue", "-h", "-o", "%i")
        return out.stdout.split()

    def job_state(self, job_id: str) -> str | None:
        """PENDING/RUNNING/COMPLETING/...; None once the job left the queue (done, failed or cancelled)."""
        out = self.run("squeue", "-h", "-j", str(job_id), "-o", "%T")
        return out.stdout.strip() or None

    def wait_gone(self, job_id: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.job_state(job_id) is None:
                return True
            time.sleep(1)
        return False

    def cancel_all(self, timeout: float = 60) -> None:
        """Leave an empty queue for the next test (jobs of a failed test would otherwise hold the CPUs)."""
        ids = self.job_ids()
        if ids:
            self.run("scancel", *ids)
        deadline = time.monotonic() + timeout
        while self.job_ids() and time.monotonic() < deadline:
            time.sleep(1)


def _stop(env: dict) -> None:
    try:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, text=True, timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pass
    # Whatever `stop` could not end: the daemons this cluster started, by the pids they wrote.
    for name in ("slurmd", "slurmctld", "munged"):
        pid_file = STATE_DIR / "run" / f"{name}.pid"
        try:
            os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


@pytest.fixture(scope="session")
def slurm() -> SlurmCluster:
    if os.geteuid() != 0:
        pytest.skip("a private Slurm needs root (apt-get install slurm-wlm munge; slurmd runs as root)")
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        pytest.skip("Slurm is not installed and there is no apt-get to install it")
    env = {**os.environ, "RLFARM_SLURM_DIR": str(STATE_DIR)}
    try:
        started = subprocess.run(["bash", str(SCRIPT), "start"], env=env, capture_output=True, text=True,
                                 timeout=START_TIMEOUT_S)
    except subprocess.TimeoutExpired as timeout:
        _stop(env)
        pytest.fail(f"scripts/slurm_local.sh start did not finish in {START_TIMEOUT_S} s: {timeout.stderr!s:.2000}")
    if started.returncode != 0:
        _stop(env)
        pytest.fail(f"scripts/slurm_local.sh start failed ({started.returncode}):\n{started.stderr[-3000:]}")
    conf = STATE_DIR / "slurm.conf"
    venv_bin = str(Path(sys.executable).parent)
    cluster = SlurmCluster(conf, {
        **os.environ,
        "SLURM_CONF": str(conf),
        # Jobs inherit this environment (sbatch --export=ALL): the venv's python/rlfarm/ray come first.
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "RAY_AUTH_MODE": "disabled",
        "PYTHONUNBUFFERED": "1",
    })
    try:
        yield cluster
    finally:
        try:
            cluster.cancel_all(timeout=30)
        except Exception:
            pass
        _stop(env)

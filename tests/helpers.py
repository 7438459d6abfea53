"""Shared by CLI-level tests: run `rlfarm` in a subprocess as a user does, and read its one-line errors."""
import os
import subprocess
import sys

ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}


def rlfarm(*args, cwd=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "rlfarm.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=ENV)


def one_line_error(out) -> str:
    lines = [line for line in out.stderr.strip().splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, (out.returncode, out.stderr[-2000:])
    return lines[0]

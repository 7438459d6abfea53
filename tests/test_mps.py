"""A run's own MPS daemon (rlfarm/mps.py) on a GPU machine: started, a CUDA process in its environment becomes its
client (the daemon starts a server for it, as its log says), and quit at the end with its pipe directory gone. Without
a GPU, with a stand-in control program: quit on every way out, and what a daemon that will not quit or start leaves."""
import os
import shutil
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from rlfarm.mps import PIPE_ENV, client_options, mps_daemon

CUDA_WORK = "import torch; x = torch.ones(1024, device='cuda'); print(float((x @ x).item()))"


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nvidia-cuda-mps-control") is None, reason="needs NVIDIA's MPS control program")
def test_a_run_s_mps_daemon_serves_its_cuda_processes_and_quits(tmp_path):
    cfg = OmegaConf.create({"topology": {"mps": True}, "ray": {"address": None}})
    with mps_daemon(cfg, tmp_path) as pipe:
        env = client_options()["runtime_env"]["env_vars"]  # what the labelers are started with
        assert env[PIPE_ENV] == str(pipe) and PIPE_ENV not in os.environ  # the driver itself is no client
        client = subprocess.run([sys.executable, "-c", CUDA_WORK], capture_output=True, text=True, timeout=120,
                                env={**os.environ, **env})
        assert client.returncode == 0, client.stderr[-2000:]
        assert client.stdout.strip() == "1024.0"
    assert client_options() == {} and not pipe.exists()
    control_log = (tmp_path / "mps" / "control.log").read_text()
    assert "server" in control_log.lower(), control_log[-2000:]  # a server was started for the client


# A stand-in for NVIDIA's control program (no GPU here): `-d` makes the control pipe and exits, as the daemon does;
# a command on stdin is noted, and `quit` removes the pipe. FAKE_MPS_FAIL=start|quit makes that step fail as the
# driver's program does (a message, exit 1).
FAKE_CONTROL = """#!/bin/sh
if [ "$1" = "-d" ]; then
  [ "$FAKE_MPS_FAIL" = start ] && { echo "An instance of this daemon is already running" >&2; exit 1; }
  touch "$CUDA_MPS_PIPE_DIRECTORY/control"; exit 0
fi
read command; echo "$command" >> "$FAKE_MPS_NOTES"
[ "$FAKE_MPS_FAIL" = quit ] && { echo "Cannot find MPS control daemon process" >&2; exit 1; }
rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"
"""


@pytest.fixture
def fake_control(tmp_path, monkeypatch):
    bin_dir, temp = tmp_path / "bin", tmp_path / "temp"
    bin_dir.mkdir(), temp.mkdir()
    (bin_dir / "nvidia-cuda-mps-control").write_text(FAKE_CONTROL)
    (bin_dir / "nvidia-cuda-mps-control").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MPS_NOTES", str(tmp_path / "notes"))
    monkeypatch.setattr("tempfile.tempdir", str(temp))  # where the run's pipe directory is made
    return temp, tmp_path / "notes"


CFG = OmegaConf.create({"topology": {"mps": True}, "ray": {"address": None}})


def test_the_daemon_is_told_to_quit_however_the_run_ends(tmp_path, fake_control):
    temp, notes = fake_control
    with pytest.raises(RuntimeError, match="the run failed"):
        with mps_daemon(CFG, tmp_path / "run") as pipe:
            assert client_options()["runtime_env"]["env_vars"][PIPE_ENV] == str(pipe)
            raise RuntimeError("the run failed")
    assert notes.read_text().split() == ["quit"] and not list(temp.iterdir()) and client_options() == {}


def test_a_daemon_that_will_not_quit_keeps_its_pipe_for_the_command_the_warning_gives(tmp_path, fake_control,
                                                                                      monkeypatch, caplog):
    temp, _ = fake_control
    monkeypatch.setenv("FAKE_MPS_FAIL", "quit")
    with mps_daemon(CFG, tmp_path / "run") as pipe:
        pass
    assert pipe.exists() and f"{PIPE_ENV}={pipe}" in caplog.text and "Cannot find MPS control daemon" in caplog.text


def test_a_failed_start_is_one_line_and_leaves_no_pipe_directory(tmp_path, fake_control, monkeypatch):
    from rlfarm.errors import ConfigError

    temp, notes = fake_control
    monkeypatch.setenv("FAKE_MPS_FAIL", "start")
    with pytest.raises(ConfigError, match="did not start: An instance of this daemon is already running"):
        with mps_daemon(CFG, tmp_path / "run"):
            pass
    assert not list(temp.iterdir()) and not notes.exists() and client_options() == {}

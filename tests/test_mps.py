"""A run's own MPS daemon (rlfarm/mps.py) on a GPU machine: started, a CUDA process in its environment becomes its
client (the daemon starts a server for it, as its log says), and quit at the end with its pipe directory gone."""
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

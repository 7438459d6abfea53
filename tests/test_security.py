"""What rlfarm exposes: the local Ray it starts, the run directory it writes, the checkpoints it loads.

- A private local Ray (rlfarm/cluster.py::ray_session) is reachable from this machine only: its node address
  is 127.0.0.1, every socket its processes listen on is a loopback one, and it serves no dashboard unless
  ray.dashboard=true (then on 127.0.0.1 only).
- A run directory holds no secret from the environment (API keys, tokens): it is shared and uploaded.
- Checkpoints are plain tensors and numbers: they load with torch.load(weights_only=True), which runs no
  pickled code.
"""
import ipaddress
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import shared_ray_pids

SECRETS = {"WANDB_API_KEY": "wandb-secret-5f1c2e", "HF_TOKEN": "hf_secretToken9c3d1",
           "AWS_SECRET_ACCESS_KEY": "aws-secret-7b2a99"}
TINY = ["total_env_steps=300", "algo.learning_starts=100", "algo.batch_size=32", "model.actor.hidden=[32,32]",
        "model.critic.hidden=[32,32]", "run.live=false"]
DASHBOARD_PORT = 8265


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return address.is_loopback


def _ray_listeners() -> list[tuple[str, str, int]]:
    """(process, ip, port) for every listening TCP socket of the processes this test process started (the
    shared cluster of other modules' runs, helpers.shared_ray_address, left out: it is not the run's)."""
    import psutil

    rows, shared = [], shared_ray_pids()
    for proc in psutil.Process().children(recursive=True):
        if proc.pid in shared:
            continue
        try:
            argv = proc.cmdline() or [proc.name()]
            program = [os.path.basename(a) for a in argv[:2]]
            name = program[1] if program[0].startswith("python") and len(program) > 1 else program[0]
            rows += [(name, c.laddr.ip, c.laddr.port) for c in proc.net_connections(kind="tcp")
                     if c.status == psutil.CONN_LISTEN]
        except psutil.Error:  # a worker that exited meanwhile
            continue
    return rows


def _local_ray_facts(overrides: list[str]) -> dict:
    """Start Ray as `rlfarm train` does, let its agents and a worker come up, and record what it exposes."""
    import ray

    from rlfarm.cluster import ray_session
    from rlfarm.config import compose
    from rlfarm.families import family_of
    from rlfarm.topology import plan_topology

    cfg = compose("train", ["ray.num_cpus=2", *overrides])
    with ray_session(cfg.ray, plan_topology(cfg.topology, family_of(cfg))):
        ray.get(ray.remote(lambda: None).options(num_cpus=0).remote())  # a worker, with its gRPC server
        info = dict(ray._private.worker.global_worker.node.address_info)
        from ray._private.utils import get_dashboard_dependency_error

        # the dashboard agent (ray[default] only: a minimal Ray starts none) comes up after the driver connects
        deadline = time.monotonic() + (0 if get_dashboard_dependency_error() else 20)
        while time.monotonic() < deadline and not any("DashboardAgent" in p for p, _, _ in _ray_listeners()):
            time.sleep(0.5)
        return {"gcs_address": ray.get_runtime_context().gcs_address, "address_info": info,
                "listeners": _ray_listeners()}


@pytest.fixture(scope="module")
def default_ray() -> dict:
    return _local_ray_facts([])


# Ray maps _node_ip_address="127.0.0.1" to the machine's LAN address and binds all interfaces unless
# rlfarm/cluster.py puts a private local Ray in its single-machine (loopback) mode.
def test_local_ray_node_address_is_loopback(default_ray):
    assert default_ray["address_info"]["node_ip_address"] == "127.0.0.1"
    assert default_ray["gcs_address"].rsplit(":", 1)[0] == "127.0.0.1"


def test_local_ray_listens_on_loopback_only(default_ray):
    exposed = [row for row in default_ray["listeners"] if not _is_loopback(row[1])]
    assert default_ray["listeners"] and not exposed, exposed


def test_no_dashboard_unless_asked(default_ray):
    assert not default_ray["address_info"].get("webui_url")
    assert not [row for row in default_ray["listeners"] if row[2] == DASHBOARD_PORT], default_ray["listeners"]
    # ray[default] still starts dashboard.py (head modules only, no web UI): whatever it opens stays on loopback
    assert all(_is_loopback(ip) for name, ip, _ in default_ray["listeners"] if name == "dashboard.py")


def test_dashboard_when_asked_serves_loopback_only():
    from ray._private.utils import get_dashboard_dependency_error

    if get_dashboard_dependency_error():  # a minimal Ray install: rlfarm refuses with one line instead (below)
        pytest.skip("ray[default] (dashboard packages) not installed")
    facts = _local_ray_facts(["ray.dashboard=true"])
    url = facts["address_info"].get("webui_url") or ""
    assert url.rsplit(":", 1)[0] in ("127.0.0.1", "localhost"), url
    port = int(url.rsplit(":", 1)[1])
    serving = [row for row in facts["listeners"] if row[2] == port]
    assert serving and all(_is_loopback(ip) for _, ip, _ in serving), serving


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A tiny `rlfarm train` with secrets in its environment, as a user's shell would have them."""
    tmp = tmp_path_factory.mktemp("secrets")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1", **SECRETS}
    out = subprocess.run([sys.executable, "-m", "rlfarm.cli", "train", f"hydra.run.dir={tmp}/run", *TINY],
                         capture_output=True, text=True, timeout=600, cwd=tmp, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return tmp / "run", out


def test_run_directory_holds_no_environment_secret(tiny_run):
    run_dir, out = tiny_run
    assert (run_dir / "config.yaml").exists() and (run_dir / "summary.json").exists()
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    for secret in SECRETS.values():
        assert secret not in out.stdout + out.stderr
        leaked = [str(p.relative_to(run_dir)) for p in files if secret.encode() in p.read_bytes()]
        assert not leaked, f"{secret!r} found in {leaked}"


def test_checkpoints_load_without_unpickling_code(tiny_run):
    import torch

    run_dir, _ = tiny_run
    checkpoints = sorted((run_dir / "checkpoints").rglob("*.pt"))
    assert checkpoints
    for path in checkpoints:
        state = torch.load(path, weights_only=True, map_location="cpu")
        assert isinstance(state, dict) and state


def test_dashboard_without_its_packages_is_one_clear_line(monkeypatch):
    import ray._private.utils as ray_utils

    from rlfarm.cluster import ray_session
    from rlfarm.config import compose
    from rlfarm.errors import ConfigError
    from rlfarm.families import family_of
    from rlfarm.topology import plan_topology

    monkeypatch.setattr(ray_utils, "get_dashboard_dependency_error", lambda: "aiohttp missing")
    cfg = compose("train", ["ray.dashboard=true"])
    with pytest.raises(ConfigError, match="ray.dashboard=true needs"):
        with ray_session(cfg.ray, plan_topology(cfg.topology, family_of(cfg))):
            pass

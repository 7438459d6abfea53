"""Ray session for one rlfarm command: join a cluster or start a private local one, after checking
that it can hold the topology. A local cluster listens on 127.0.0.1 only and runs no dashboard
unless asked; Ray's token auth stays as Ray sets it."""
from __future__ import annotations

import logging
import os
from contextlib import contextmanager

from omegaconf import DictConfig

from rlfarm.errors import ConfigError
from rlfarm.topology import Plan, check_cluster, local_resources

# Set before Ray starts so that every worker inherits them: headless MuJoCo rendering, quiet Ray.
WORKER_ENV = {"MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl", "RAY_DEDUP_LOGS": "1"}


def _loopback_only(ray) -> None:
    """A private local cluster must not be reachable from the network. Ray 2.60 replaces
    _node_ip_address=127.0.0.1 by the machine's address and binds GCS/raylet/workers on all interfaces unless
    it runs in its single-machine mode (the one it uses on macOS/Windows); that mode binds loopback only
    (checked in tests/test_security.py by listing the listening sockets)."""
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


@contextmanager
def ray_session(ray_cfg: DictConfig, plan: Plan):
    import ray

    for key, value in WORKER_ENV.items():
        os.environ.setdefault(key, value)
    # Token auth stays on (Ray's default); its notice on every start is noise for a local private cluster.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    if ray_cfg.address:
        ray.init(address=ray_cfg.address, logging_level=logging.WARNING, log_to_driver=True)
        try:
            check_cluster(plan, ray.cluster_resources())
        except Exception:
            ray.shutdown()
            raise
    else:
        available = local_resources(ray_cfg.num_cpus, ray_cfg.num_gpus)
        check_cluster(plan, available)  # before paying Ray's start-up
        if ray_cfg.dashboard:
            from ray._private.utils import get_dashboard_dependency_error

            if get_dashboard_dependency_error():
                raise ConfigError("ray.dashboard=true needs Ray's dashboard packages",
                                  "pip install 'ray[default]', or leave ray.dashboard=false")
        _loopback_only(ray)
        ray.init(num_cpus=int(available["CPU"]) if float(available["CPU"]).is_integer() else available["CPU"],
                 num_gpus=int(available["GPU"]), include_dashboard=bool(ray_cfg.dashboard),
                 _node_ip_address="127.0.0.1", logging_level=logging.WARNING, log_to_driver=True,
                 configure_logging=True)
    try:
        yield ray
    finally:
        ray.shutdown()

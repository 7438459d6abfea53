"""Ray session for one rlfarm command: join a cluster or start a private local one, after checking
that it can hold the topology. A local cluster listens on 127.0.0.1 only and runs no dashboard
unless asked; Ray's token auth stays as Ray sets it. A cluster to join is probed first (`cluster_address`,
also the commands' preflight), so a wrong address costs seconds and one line instead of Ray's retries."""
from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from contextlib import contextmanager

from omegaconf import DictConfig

from rlfarm.errors import ConfigError
from rlfarm.topology import Plan, check_cluster, local_resources, missing_nodes

# Set before Ray starts so that every worker inherits them: headless MuJoCo rendering, quiet Ray.
WORKER_ENV = {"MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl", "RAY_DEDUP_LOGS": "1"}
# Set by the driver for the run and handed to every worker, on a cluster joined too: the modules that register the
# run's env (env.imports, rlfarm/envs/registry.py). Ray puts the driver's directory on the workers' path itself.
FORWARDED_ENV = ("RLFARM_ENV_IMPORTS",)


def _runtime_env() -> dict | None:
    env_vars = {key: os.environ[key] for key in FORWARDED_ENV if os.environ.get(key)}
    return {"env_vars": env_vars} if env_vars else None


def _loopback_only(ray) -> None:
    """A private local cluster must not be reachable from the network. Ray 2.60 replaces
    _node_ip_address=127.0.0.1 by the machine's address and binds GCS/raylet/workers on all interfaces unless
    it runs in its single-machine mode (the one it uses on macOS/Windows); that mode binds loopback only
    (checked in tests/test_security.py by listing the listening sockets)."""
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


# How long `ray.address` may take to answer: a cluster's GCS answers in milliseconds, while ray.init on an
# address where no GCS listens retries for ~80 s (minutes where another server listens) and prints its client log.
CONNECT_TIMEOUT_S = 3.0
NO_CLUSTER_FIX = ("start the cluster there with `ray start --head --port=<port>`, fix ray.address, "
                  "or leave ray.address=null for a private local cluster")
# A GCS (and a Ray client server) speaks gRPC: HTTP/2 without TLS. Sent the client preface and an empty SETTINGS
# frame, it answers with its own SETTINGS frame; an HTTP/1 server (the dashboard's port, a typo) does not.
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
HTTP2_SETTINGS = 4  # frame type, the 4th byte of a frame header


def cluster_address(address: str) -> str:
    """The address to hand ray.init for `ray.address`, after checking in seconds that a Ray cluster answers
    there: ConfigError (one line) otherwise. `auto` is looked up as Ray does (RAY_ADDRESS, then the cluster
    `ray start` started on this machine); `ray://host:port` (Ray client) is probed at host:port."""
    resolved = _auto_address() if address == "auto" else address
    problem = _grpc_problem(*_host_port(resolved))
    if problem:
        where = f"ray.address={address}" if resolved == address else f"{resolved} (ray.address={address})"
        raise ConfigError(f"no Ray cluster answers at {where}: {problem}", NO_CLUSTER_FIX)
    return resolved


def _grpc_problem(host: str, port: int) -> str | None:
    """Why no gRPC server answers at host:port within CONNECT_TIMEOUT_S, or None when one does."""
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S) as connection:
            connection.sendall(HTTP2_PREFACE)
            header = b""
            while len(header) < 9 and (part := connection.recv(9 - len(header))):
                header += part
    except socket.timeout:
        return f"no answer in {CONNECT_TIMEOUT_S:g} s"
    except socket.gaierror:
        return "unknown host"
    except OSError as error:
        return (error.strerror or str(error)).lower()
    if len(header) < 4 or header[3] != HTTP2_SETTINGS:
        return "something listens there, but it is not a Ray GCS (the dashboard's port?)"
    return None


def _auto_address() -> str:
    from ray._private.services import get_ray_address_from_environment

    try:
        found = get_ray_address_from_environment("auto", None)
    except ConnectionError:
        found = None
    if not found:
        raise ConfigError("ray.address=auto found no running Ray cluster on this machine",
                          "start one with `ray start --head`, set ray.address=<host:port>, "
                          "or leave ray.address=null for a private local cluster")
    return found


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"ray.address={address} is not host:port",
                          "set ray.address=<head node>:<GCS port> (ray start prints it, e.g. 10.0.0.1:6379), or auto")
    return host.strip("[]"), int(port)  # [::1]:6379 is IPv6


@contextmanager
def ray_session(ray_cfg: DictConfig, plan: Plan, wait_s: float = 0.0):
    """wait_s: how long a joined cluster may take to gain the nodes the plan's pools are pinned to (a node that
    joins after the driver; `run.restart_timeout_s` for a run)."""
    import ray

    for key, value in WORKER_ENV.items():
        os.environ.setdefault(key, value)
    # Token auth stays on (Ray's default); its notice on every start is noise for a local private cluster.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    # Ray's start takes seconds with nothing on screen: say what is happening
    if ray_cfg.address:
        address = cluster_address(str(ray_cfg.address))
        logging.getLogger("rlfarm").info("joining Ray at %s …", address)
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=True, runtime_env=_runtime_env())
        try:
            wait_for_pinned_nodes(plan, ray.cluster_resources, wait_s)
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
        # address="local": a private cluster even where RAY_ADDRESS is set (ray.init would join that one)
        cpus = int(available["CPU"]) if float(available["CPU"]).is_integer() else available["CPU"]
        logging.getLogger("rlfarm").info("starting Ray (a private local cluster: %s CPUs, %d GPUs) …", cpus,
                                         int(available["GPU"]))
        ray.init(address="local", num_cpus=cpus,
                 num_gpus=int(available["GPU"]), include_dashboard=bool(ray_cfg.dashboard),
                 _node_ip_address="127.0.0.1", logging_level=logging.WARNING, log_to_driver=True,
                 configure_logging=True, runtime_env=_runtime_env())
    try:
        yield ray
    finally:
        ray.shutdown()


NODE_POLL_S = 1.0  # how often the cluster is asked for a node that has not joined yet


def wait_for_pinned_nodes(plan: Plan, resources: Callable[[], Mapping[str, float]], wait_s: float,
                          poll_s: float = NODE_POLL_S) -> None:
    """Return once the cluster holds every node a pool is pinned to (`resources()`: its total resources, asked
    every `poll_s`), waiting at most `wait_s` for one that has not joined yet; then `check_cluster` (one line when
    the plan does not fit, naming a node that never came)."""
    available, started = resources(), time.monotonic()
    if (missing := missing_nodes(plan, available)) and wait_s > 0:
        logging.getLogger("rlfarm").info("waiting for a node with %s (up to %g s) …",
                                         ", ".join(node for _, node in missing), wait_s)
    while missing and time.monotonic() - started < wait_s:
        time.sleep(poll_s)
        available = resources()
        missing = missing_nodes(plan, available)
    check_cluster(plan, available, wait_s)


# -- where roles run: node ids for roles.json and `rlfarm plan`, and a node Ray has declared dead ----------------
RAY_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory", "accelerator_type")
# node id → its custom resources, noted while it lives: Ray forgets a dead node's resources, a line names them
_NODE_RESOURCES: dict[str, list[str]] = {}


def actor_node(actor) -> str | None:
    """The id of the node an actor's current incarnation runs on, from Ray's actor table in the GCS (no dashboard
    needed); None when Ray cannot tell (not started yet, restarting, or not a Ray actor)."""
    from ray._private import state

    try:
        node = (state.actors(actor._actor_id.hex()).get("Address") or {}).get("NodeID")
    except Exception:  # noqa: BLE001 - a stand-in role of the unit tests, or Ray gone: roles.json says null
        return None
    if node and node not in _NODE_RESOURCES:
        node_labels()  # notes the resources of every node alive now
    return node or None


def actor_state(actor) -> str | None:
    """The state Ray's actor table holds for an actor ("ALIVE", "RESTARTING", "DEAD", ...); None when Ray cannot
    tell. A worker on a node switched off stays "ALIVE" there until Ray declares the node dead."""
    from ray._private import state

    try:
        return state.actors(actor._actor_id.hex()).get("State") or None
    except Exception:  # noqa: BLE001 - a stand-in role of the unit tests, or Ray gone
        return None


def _custom_resources(node: dict) -> list[str]:
    custom = [name for name in node.get("Resources", {}) if name not in RAY_RESOURCES and not name.startswith("node:")]
    if node.get("Alive"):
        _NODE_RESOURCES[node["NodeID"]] = custom
    return custom or _NODE_RESOURCES.get(node["NodeID"], [])


def node_labels() -> dict[str, str]:
    """Node id → how a table names it: its id's first 8 characters and its custom resources ("19c193d6 node_b")."""
    import ray

    return {n["NodeID"]: " ".join([n["NodeID"][:8], *_custom_resources(n)]) for n in ray.nodes()}


def lost_node(node_id: str) -> str | None:
    """How a line names a node Ray has declared dead ("node 19c193d6 (10.0.0.2, node_b)": id, address, custom
    resources); None while it lives (or is unknown)."""
    import ray

    node = next((n for n in ray.nodes() if n["NodeID"] == node_id), None)
    if node is None or node["Alive"]:
        return None
    return f"node {node_id[:8]} ({', '.join([node['NodeManagerAddress'], *_custom_resources(node)])})"

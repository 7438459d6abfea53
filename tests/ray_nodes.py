"""Real Ray nodes on this machine, started as a user starts them (`ray start --block`, each in its own session, with
its own raylet, object store, ports, private temp dir and a custom resource `node_<name>`): the two-node cluster of
tests/multinode and the shared cluster each xdist worker runs its `rlfarm train` subprocesses on (helpers.py).

Stopping: SIGTERM to each `ray start --block` (it stops what it started), then SIGKILL to its whole session and
to any process whose command line names the cluster's temp dir (a worker that outlived its raylet). `ray stop` is
not used: it stops every Ray on the machine, other tests' and other users' too."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

START_TIMEOUT_S = 120  # a head starts in ~5 s alone, ~20 s on a loaded 2-core machine
# Ray gives a raylet a fixed 30 s to register with the GCS (ray/_private/node.py); `ray_start.py` waits longer
# (REGISTRATION_WAIT_S), so a slow start under heavy load is waited for rather than killed and begun again. A start
# that fails otherwise (a port taken meanwhile) is tried this many times, with other ports.
RAY_START = Path(__file__).with_name("ray_start.py")  # `ray start` with a patient raylet registration
START_ATTEMPTS = 3
STOP_TIMEOUT_S = 15
# GCS settings for the head (RAY_<name> environment variables): a dead raylet is noticed after 3 failed checks
# 1 s apart instead of Ray's 5 x 3 s. Not faster: a raylet starting on a loaded 2-core machine must still answer
# in time (checks of 300 ms declared starting nodes dead before they registered).
FAST_HEALTH_CHECK = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "2000",
                     "RAY_health_check_failure_threshold": "3"}


def _free_ports(count: int) -> list[int]:
    """Ports free now, for the ones Ray would otherwise take at fixed defaults (client server 10001, dashboard 8265,
    agent 52365, ...): two nodes on one machine, and other tests' Ray beside them, must not collide."""
    import socket

    sockets = [socket.socket() for _ in range(count)]
    for one in sockets:
        one.bind(("127.0.0.1", 0))
    ports = [one.getsockname()[1] for one in sockets]
    for one in sockets:
        one.close()
    return ports


@dataclass
class Node:
    name: str               # "a" (head) or "b"
    process: subprocess.Popen
    temp_dir: Path
    log: Path

    def started(self) -> bool:
        return "Ray runtime started" in self.log.read_text(errors="replace")

    def pids(self) -> list[int]:
        """Every live process of this node: its `ray start` session, and whatever names its temp dir."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                session = os.getsid(int(entry.name))
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, ProcessLookupError):
                continue
            if session == self.process.pid or str(self.temp_dir) in cmdline:
                found.append(int(entry.name))
        return found

    def kill(self) -> None:
        """SIGKILL to every process of the node at once, raylet first: a machine that is switched off."""
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(timeout=STOP_TIMEOUT_S)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        self.kill()


@dataclass
class RayNodes:
    root: Path
    address: str = ""
    nodes: dict[str, Node] = field(default_factory=dict)  # the newest node of each name
    gone: list[Node] = field(default_factory=list)         # nodes started before them (killed or stopped)

    def start_node(self, name: str, cpus: int, gpus: int = 0, *, nice: bool = True, fast_health_check: bool = True,
                   object_store_mb: int = 100) -> Node:
        """Start node `name` ("a": the head), at nice 19 unless `nice` is false, the head with a fast node health
        check (a killed node is declared dead in ~3 s) unless `fast_health_check` is false. A start that fails (a
        port taken meanwhile, a raylet that missed its start-up deadline on a loaded machine) is tried again, with
        other ports."""
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                return self._start_node(name, cpus, gpus, nice, fast_health_check, object_store_mb)
            except RuntimeError as error:
                if attempt == START_ATTEMPTS:
                    raise
                print(f"retrying: {error}")

    def _start_node(self, name: str, cpus: int, gpus: int, nice: bool, fast_health_check: bool,
                    object_store_mb: int) -> Node:
        temp_dir = self.root / f"{name}{len(self.gone) + len(self.nodes)}"
        log = self.root / f"{temp_dir.name}.log"
        head = name == "a"
        ports = dict(zip(("dashboard-agent-listen", "dashboard-agent-grpc", "metrics-export", "runtime-env-agent",
                          "ray-client-server", "dashboard"), _free_ports(6)))
        if not head:
            del ports["ray-client-server"], ports["dashboard"]
        args = [sys.executable, str(RAY_START), "start", "--block", f"--num-cpus={cpus}", f"--num-gpus={gpus}",
                *(f"--{flag}-port={port}" for flag, port in ports.items()),
                f"--resources={{\"node_{name}\": 1}}", f"--temp-dir={temp_dir}", "--disable-usage-stats",
                f"--object-store-memory={object_store_mb * 1_000_000}",
                *(["--head", "--port=0", "--include-dashboard=false", "--node-ip-address=127.0.0.1"] if head
                  else [f"--address={self.address}"])]
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", **(FAST_HEALTH_CHECK if head and fast_health_check else {})}
        with open(log, "w") as out:
            process = subprocess.Popen([*(["nice", "-n", "19"] if nice else []), *args], stdout=out,
                                       stderr=subprocess.STDOUT, env=env, start_new_session=True)
        node = Node(name, process, temp_dir, log)
        if name in self.nodes:
            self.gone.append(self.nodes[name])
        self.nodes[name] = node
        deadline = time.monotonic() + START_TIMEOUT_S
        while not node.started():
            if process.poll() is not None or time.monotonic() > deadline:
                node.stop()
                raise RuntimeError(f"ray start (node {name}) did not start: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        if head:  # "To add another node to this Ray cluster, run  ray start --address='<ip>:<port>'"
            self.address = re.search(r"--address='([^']+)'", log.read_text()).group(1)
        return node

    def node_id(self, name: str) -> str:
        """The Ray node id of the newest node `name` (its raylet names files with it in the session dir)."""
        found = sorted(self.nodes[name].temp_dir.glob("session_*/runtime_env_agent_port_*"))
        return found[0].name.rsplit("_", 1)[1]

    def stop(self) -> None:
        for node in [*reversed(list(self.nodes.values())), *self.gone]:
            node.stop()

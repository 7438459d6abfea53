"""A real two-node Ray cluster on this machine for tests/multinode: a head (node A) and a worker node (node B),
each started with `ray start --block` in its own session, with its own raylet, object store, ports, private temp
dir and a custom resource (`node_a` / `node_b`) that topology=two_node_cpu pins its pools to. Node B declares
GPUs, so placement of GPU shares across nodes can be checked on CPU. Starting and stopping nodes: tests/ray_nodes.py.

The head runs its GCS with a fast node health check, so a killed node is declared dead in about 3 s
(Ray's default takes ~15 s); `node_b_lost` kills node B's raylet and workers as a crashed machine would."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from ray_nodes import RayNodes


@pytest.fixture(scope="module")
def two_nodes():
    """Node A: the head, 2 CPUs, {"node_a": 1}; node B: 2 CPUs, 2 declared GPUs, {"node_b": 1}. Yields the
    cluster (`address` for ray.address=, `nodes["b"].kill()`, `start_node("b", ...)` to bring a node B back)."""
    root = Path(tempfile.mkdtemp(prefix="rlmn"))  # short: Ray's socket paths live under it (108-byte limit)
    cluster = RayNodes(root)
    try:
        cluster.start_node("a", cpus=2)
        cluster.start_node("b", cpus=2, gpus=2)
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)

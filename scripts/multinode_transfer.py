"""MB/s of a chunk and of a weight publication through Ray's object store, to a role on the same node and to a
role on another node: what the off-policy pipeline (chunk refs runner → labeler → learner) and the object-store
weight path (rlfarm/sync/object_store.py) pay when topology=two_node_cpu splits them over two nodes.

A sender on the node holding `node_a` puts each object once (as the runner and the learner's publisher do);
a receiver on `node_a` and one on `node_b` each fetch it (`ray.get` inside the actor: a local store maps it, a
remote one pulls it over the network first). Every round puts a fresh object, so nothing is read from a copy
an earlier round left. Needs a cluster of two nodes started with --resources '{"node_a": 1}' / '{"node_b": 1}':

    python scripts/multinode_transfer.py --address <head>:<port> [--rounds 20]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import ray

SIZES_MB = (1, 16, 64)


@ray.remote(num_cpus=0, resources={"node_a": 0.001})
class Sender:
    def chunk(self, mb: int) -> list:
        """A chunk record's arrays (observations, actions, ...): `mb` MB of float32 in the store, boxed."""
        steps = mb * 2**20 // (4 * 64)
        return [ray.put({"obs": np.random.rand(steps, 48).astype(np.float32),
                         "actions": np.random.rand(steps, 16).astype(np.float32)})]

    def weights(self, mb: int) -> list:
        """A publication: a state dict of CPU tensors of `mb` MB, boxed as rlfarm's object-store sender does."""
        import torch

        layers = max(mb // 4, 1)
        return [ray.put({f"layer{i}.weight": torch.rand(1024, mb * 2**18 // (1024 * layers)) for i in range(layers)})]


class Receiver:
    def fetch(self, boxed: list) -> tuple[float, int]:
        """Seconds to have the object readable here, and its bytes."""
        started = time.perf_counter()
        value = ray.get(boxed[0])
        seconds = time.perf_counter() - started
        sizes = [v.nbytes if hasattr(v, "nbytes") else v.numel() * v.element_size() for v in value.values()]
        return seconds, sum(sizes)


def measure(address: str, rounds: int) -> list[dict]:
    ray.init(address=address, log_to_driver=False)
    sender = Sender.remote()
    receivers = {node: ray.remote(Receiver).options(num_cpus=0, resources={node: 0.001}).remote()
                 for node in ("node_a", "node_b")}
    rows = []
    for kind in ("chunk", "weights"):
        for mb in SIZES_MB:
            for node, receiver in receivers.items():
                mbps = []
                for _ in range(rounds + 1):  # the first round warms the path up: not counted
                    boxed = ray.get(getattr(sender, kind).remote(mb))
                    seconds, size = ray.get(receiver.fetch.remote(boxed))
                    mbps.append(size / 2**20 / seconds)
                rows.append({"what": kind, "MB": mb, "to": "same node" if node == "node_a" else "other node",
                             "MB_per_s_median": round(statistics.median(mbps[1:]), 1)})
                print(json.dumps(rows[-1]), flush=True)
    ray.shutdown()
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    measure(args.address, args.rounds)

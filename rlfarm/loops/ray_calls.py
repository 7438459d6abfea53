"""The seam between a driver's logic and Ray: the calls the supervisor and the off-policy loop make to wait on
roles' answers, read them, tell a death, and kill a stuck role. Production passes `RAY`, whose methods are Ray's
own functions and rlfarm/loops/deadlines.py's (nothing in between, so no cost); the unit tests pass stand-ins
that answer from fake roles, so the logic is tested in seconds without a Ray cluster.

Calls on a role (`actor.stats.remote()`) are not part of the seam: a fake role answers `.remote()` itself with a
ref the stand-ins understand."""
from __future__ import annotations

import ray

from rlfarm import cluster
from rlfarm.loops import deadlines


class RayCalls:
    wait = staticmethod(ray.wait)              # (refs, num_returns, timeout) -> (ready, pending)
    get = staticmethod(ray.get)                # (ref or refs, timeout) -> value; raises the role's error
    kill = staticmethod(ray.kill)              # (actor, no_restart) -> None
    ask = staticmethod(deadlines.ask)          # several named roles' answers within a deadline
    ask_one = staticmethod(deadlines.ask_one)  # one named role's answer within a deadline
    died = staticmethod(deadlines.died)        # (a finished run() ref) -> the actor-death error, or None
    node_of = staticmethod(cluster.actor_node)  # (actor) -> the id of the node it runs on, or None
    actor_state = staticmethod(cluster.actor_state)  # (actor) -> its state in Ray's actor table ("ALIVE", "DEAD", ...)
    lost_node = staticmethod(cluster.lost_node)  # (node id) -> how a line names it once Ray declared it dead, or None


RAY = RayCalls()

"""Watch a run's roles: notice when a restartable worker (an env runner, a labeler, a VLA rollout worker or
inference server) dies or hangs, hand it to Ray for a restart and back to the loop for re-wiring, and keep
`roles.json` (which process runs which role now). Every family with restartable workers uses it. The learner is
watched but not restarted: its state is the run's state, and a checkpoint + `resume` is how it comes back. What
an off-policy run's dead runner incarnations did is counted by rlfarm/loops/ledger.py.

No wait on a role is open-ended (rlfarm/loops/deadlines.py). `poll` keeps one stats request per role in flight and
never waits past its `wait_s`; `unresponsive` names the roles whose request is older than the deadline, the
labelers stuck in one reward-model call for longer (a labeler reports `in_call_s` from another thread of its
threaded actor) and the VLA rollout workers whose rollout has not moved for longer (`stalled_s`, from their watch
thread). `kill` hands such a worker to Ray for a restart (the recovery path then re-wires it as after any death),
or ends the run when restarts are used up. Ray is reached through `calls` (rlfarm/loops/ray_calls.py).

A whole node can be lost (a machine off, its raylet killed): every role on it dies at once. `roles.json` records
each role's node; a worker whose node Ray has declared dead is waited for at most `lost_node_wait_s` (Ray restarts
it elsewhere if its placement allows), and otherwise the run ends with one line naming the node and its roles, after
a checkpoint when the learner lives elsewhere. The wait for a dead worker (`wait_until_restarted`), the lost node's
line and that checkpoint are functions here that the synchronous loops use as well (rlfarm/loops/skeleton.py)."""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import ray

from rlfarm.loops.deadlines import NO_PROGRESS, SLICE_S, Interrupted, WorkerLost
from rlfarm.loops.ray_calls import RAY, RayCalls

log = logging.getLogger("rlfarm")


@dataclass
class Worker:
    kind: str                         # "env_runner" | "labeler" | "engine" (a VLA inference server)
    index: int
    actor: ray.actor.ActorHandle
    incarnation: int = 0
    restarts: int = 0
    done: ray.ObjectRef | None = None  # the ref of its running `run()` call
    pid: int | None = None
    stats: dict = field(default_factory=dict)  # the newest stats of the live incarnation
    asked: tuple[ray.ObjectRef, float] | None = None  # the stats request in flight, and when it was made
    killed: bool = False               # handed to Ray for a restart; recovered once its run() fails
    node: str | None = None            # the id of the node it ran on when roles.json was last written

    @property
    def name(self) -> str:
        return f"{self.kind} {self.index}"


class Supervisor:
    def __init__(self, learner, runners: list, labelers: list, max_restarts: int, roles_file: Path | None = None,
                 engines: list = (), max_incarnations: int | None = None, calls: RayCalls = RAY,
                 learner_ranks: list = (), merge_stats: Callable[[dict, list[dict]], dict] | None = None,
                 lost_node_wait_s: float | None = None, checkpoint: Callable[[], object] | None = None):
        """`max_incarnations`: a worker is not restarted into more (an off-policy runner's chunk ids have room for
        that many, rlfarm/loops/ledger.py); None: only `max_restarts` bounds it. `learner_ranks`: the learner's
        other data-parallel ranks (1..N-1), watched like it; `learner.stats` is then rank 0's with theirs merged in
        by `merge_stats` (rlfarm/loops/learner_group.py). `lost_node_wait_s`: how long a worker whose node died is
        waited for (None: as long as any dead worker). `checkpoint`: writes one now (`checkpoint_at_node_loss`)."""
        # the learner is watched (stats, deadline) but never restarted: it is not among `workers`
        self.learner = Worker("learner", 0, learner)
        self.learner_ranks = [Worker("learner rank", i, rank) for i, rank in enumerate(learner_ranks, 1)]
        self.merge_stats = merge_stats
        self._lead_stats: dict = {}  # rank 0's own newest stats, before the other ranks' are merged in
        self.workers = [Worker("env_runner", i, a) for i, a in enumerate(runners)] + \
                       [Worker("labeler", i, a) for i, a in enumerate(labelers)] + \
                       [Worker("engine", i, a) for i, a in enumerate(engines)]
        self.max_restarts = max_restarts
        self.roles_file = roles_file
        self.max_incarnations = max_incarnations
        self.calls = calls
        self.recoveries: list[dict] = []
        self.lost_node_wait_s = lost_node_wait_s
        self.checkpoint = checkpoint

    def of(self, kind: str) -> list[Worker]:
        return [w for w in self.workers if w.kind == kind]

    def dead(self) -> list[Worker]:
        """Workers whose `run()` ended with the actor's death."""
        ready = self._ended()
        return [w for w in self.workers if w.done in ready and self.calls.died(w.done) is not None]

    @property
    def learners(self) -> list[Worker]:
        """The learner's ranks, rank 0 first: watched, never restarted."""
        return [self.learner, *self.learner_ranks]

    def poll(self, wait_s: float) -> list[Worker]:
        """Refresh the stats of every role (learner first); returns the roles whose stats are fresh (the learner's
        other ranks are not among them: rank 0 reports for the learner, their counts merged in). Each role has
        at most one stats request in flight: one that has not answered yet is waited for again next time (its age
        is what `unresponsive` judges). A worker that is dead or restarting keeps its last stats; stats from a new
        incarnation the loop has not recovered yet are ignored (the pid tells)."""
        roles, now = [*self.learners, *self.workers], time.monotonic()
        for role in roles:
            if role.asked is None:
                role.asked = (role.actor.stats.remote(), now)
        refs = {role.asked[0]: role for role in roles}
        ready, _ = self.calls.wait(list(refs), num_returns=len(refs), timeout=wait_s)
        fresh = []
        for ref in ready:
            role = refs[ref]
            role.asked = None
            try:
                stats = self.calls.get(ref)
            except ray.exceptions.RayError:
                continue
            if role.pid is None or stats["pid"] == role.pid:
                role.pid, role.stats = stats["pid"], stats
                fresh.append(role)
        if self.learner_ranks:
            self._merge_learner(fresh)
        return [role for role in fresh if role not in self.learner_ranks]

    def _merge_learner(self, fresh: list[Worker]) -> None:
        """The learner's stats: rank 0's own newest with the other ranks' newest merged in."""
        if self.learner in fresh:
            self._lead_stats = self.learner.stats
        if self._lead_stats and any(role in fresh for role in self.learners):
            self.learner.stats = self.merge_stats(self._lead_stats, [rank.stats for rank in self.learner_ranks])

    def unresponsive(self, deadline_s: float, warmup_s: float) -> list[tuple[Worker, str]]:
        """(role, what is wrong) for each live role whose stats request is older than `deadline_s`, and each
        labeler that has been in one reward-model call for longer (`warmup_s` for a labeler not warm yet: its model
        may be compiling). Dead workers and those already handed to Ray for a restart are the recovery's business,
        not this."""
        ended, now = self._ended(), time.monotonic()
        roles = [role for role in [*self.learners, *self.workers] if not role.killed and role.done not in ended]
        # an old request may have been answered since the last poll (the loop was busy elsewhere): not late
        old = [role.asked[0] for role in roles if role.asked is not None and now - role.asked[1] > deadline_s]
        _, late = self.calls.wait(old, num_returns=len(old), timeout=0) if old else ([], [])
        found, late = [], set(late)
        for role in roles:
            if role.asked is not None and role.asked[0] in late:
                found.append((role, f"did not answer stats within {deadline_s:g} s"))
                continue
            warm = role.stats.get("warm", True)
            limit = deadline_s if warm else warmup_s
            if role.stats.get("in_call_s", 0.0) > limit:
                allowed = (f"run.role_timeout_s={deadline_s:g}" if warm
                           else f"one of its first calls: run.restart_timeout_s={warmup_s:g}")
                found.append((role, f"has been in one reward-model call for {role.stats['in_call_s']:.0f} s "
                                    f"({allowed})"))
            elif role.stats.get("stalled_s", 0.0) > limit:  # a VLA rollout worker, answering from its watch thread
                allowed = (f"run.role_timeout_s={deadline_s:g}" if warm
                           else f"its first rollout: run.restart_timeout_s={warmup_s:g}")
                found.append((role, f"{NO_PROGRESS} for {role.stats['stalled_s']:.0f} s ({allowed})"))
        return found

    def kill(self, worker: Worker, problem: str) -> None:
        """Hand a stuck worker to Ray for a restart (its run() then fails, and the loop recovers it as after any
        death); raises WorkerLost when it may not be restarted again."""
        if not self._may_restart(worker):
            raise WorkerLost(f"{worker.name} {problem}, and run.max_restarts={self.max_restarts} is used up "
                             "(raise it, or resume the run: rlfarm train resume=<run_dir>)")
        log.warning("%s (pid %s) %s: killing it for Ray to restart", worker.name, worker.pid, problem)
        worker.killed = True
        self.calls.kill(worker.actor, no_restart=False)

    def wait_until_back(self, worker: Worker, timeout_s: float, interrupted: Callable[[], bool] | None = None) -> int:
        """Block until Ray has restarted the worker (at most `timeout_s`; Interrupted when `interrupted()` turns
        true meanwhile); returns its new pid. A worker out of restarts, or one whose node was lost, ends the run."""
        try:
            if not self._may_restart(worker):
                raise NodeLost.or_else(
                    node_verdict(self.calls, worker.actor, worker.node, self.lost_node_wait_s, interrupted),
                    f"{worker.name} died and run.max_restarts={self.max_restarts} is used up "
                    "(raise it, or resume the run: rlfarm train resume=<run_dir>)")
            return wait_until_restarted(self.calls, worker.name, worker.actor, worker.pid, worker.node, timeout_s,
                                        self.lost_node_wait_s, interrupted)
        except NodeLost as lost:
            if self.checkpoint is not None:
                checkpoint_at_node_loss(lost.node, worker.node, self.learner.node, self.checkpoint)
            names = [role.name if role.kind != "learner" else "the learner"
                     for role in [*self.learners, *self.workers] if role.node == worker.node]
            raise NodeLost(lost.node, node_lost_line(lost.node, names, self.lost_node_wait_s,
                                                     self.roles_file.parent if self.roles_file else None)) from None

    def _may_restart(self, worker: Worker) -> bool:
        return worker.restarts < self.max_restarts and (self.max_incarnations is None
                                                        or worker.incarnation + 1 < self.max_incarnations)

    def running(self, roles: list[Worker]) -> list[Worker]:
        """Those of `roles` whose `run()` has not ended."""
        ended = self._ended()
        return [w for w in roles if w.done not in ended]

    def _ended(self) -> set:
        """The `run()` refs that are ready: the worker returned, failed, or died."""
        refs = [w.done for w in [*self.learners, *self.workers] if w.done is not None]
        ready, _ = self.calls.wait(refs, num_returns=len(refs), timeout=0)
        return set(ready)

    def restarted(self, worker: Worker, new_pid: int, started: float, detail: dict) -> None:
        """Record a finished recovery (the loop has re-wired the worker and called `run()` again)."""
        record = {"role": worker.kind, "index": worker.index, "pid_before": worker.pid, "pid_after": new_pid,
                  "recovery_s": round(time.monotonic() - started, 3), **detail}
        worker.restarts += 1
        worker.incarnation += 1
        worker.pid, worker.stats, worker.asked, worker.killed = new_pid, {}, None, False
        self.recoveries.append(record)
        log.warning("%s (pid %s) died; restarted as pid %d and back at work in %.2f s%s", worker.name,
                    record["pid_before"], new_pid, record["recovery_s"],
                    "".join(f", {k.replace('_', ' ')} {v}" for k, v in detail.items()))
        self.write_roles_file()

    def write_roles_file(self) -> None:
        """`roles.json` in the run dir: which process, on which node, runs which worker now (for `kill`, py-spy,
        tests)."""
        if self.roles_file is None:
            return
        roles = [*self.learners, *self.workers]
        for role in roles:
            role.node = self.calls.node_of(role.actor) or role.node
        table = [{"role": w.kind.removesuffix(" rank"), "index": w.index, "pid": w.pid, "node": w.node,
                  "incarnation": w.incarnation, "restarts": w.restarts} for w in roles]
        tmp = self.roles_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(table, indent=1))
        tmp.replace(self.roles_file)


class NodeLost(WorkerLost):
    """A worker's node was declared dead by Ray and the worker did not come back; `node`: how a line names the
    node. Raised first with the node alone; the caller, which knows all the node's roles, raises it again with
    the run's line (`node_lost_line`)."""

    def __init__(self, node: str, line: str | None = None):
        super().__init__(line or node)
        self.node = node

    @staticmethod
    def or_else(node: str | None, line: str) -> WorkerLost:
        """NodeLost when Ray declared the node dead, else WorkerLost(line)."""
        return NodeLost(node) if node else WorkerLost(line)


def wait_until_restarted(calls: RayCalls, name: str, actor, pid: int | None, node: str | None, timeout_s: float,
                         lost_node_wait_s: float | None = None, interrupted: Callable[[], bool] | None = None) -> int:
    """A dead worker's new pid, once Ray has restarted it (asked through its `stats()`), within `timeout_s`. Once
    Ray has declared the worker's `node` dead, it is waited for at most `lost_node_wait_s` from the start (Ray
    restarts it elsewhere if its placement allows; a pool pinned to that node does not) and then NodeLost.
    Interrupted when `interrupted()` turns true; WorkerLost when it is not restarted or does not come back."""
    started = time.monotonic()
    deadline, lost = started + timeout_s, None
    while time.monotonic() < deadline:
        if interrupted is not None and interrupted():
            raise Interrupted(f"{name} was not waited for")
        try:
            stats = calls.get(actor.stats.remote(), timeout=min(max(deadline - time.monotonic(), 0.1), 1.0))
        except ray.exceptions.ActorDiedError as error:
            raise NodeLost.or_else(lost or node_verdict(calls, actor, node, lost_node_wait_s, interrupted),
                                   f"{name} died and was not restarted: {_first_line(error)}") from None
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            if lost is None and node is not None and (lost := calls.lost_node(node)):
                if lost_node_wait_s is not None:
                    deadline = min(deadline, started + lost_node_wait_s)
            time.sleep(SLICE_S)
            continue
        if stats["pid"] != pid:
            return stats["pid"]
        time.sleep(0.1)  # the old incarnation's pid: Ray has not noticed the death yet
    raise NodeLost.or_else(lost, f"{name} died and did not come back within {timeout_s:g} s")


def node_verdict(calls: RayCalls, actor, node: str | None, wait_s: float | None,
                 interrupted: Callable[[], bool] | None = None) -> str | None:
    """For a worker that died and will not be restarted: how a line names its node once Ray has declared that node
    dead, or None when its node lives. A node switched off tells no one: Ray declares it dead only once its health
    checks fail, seconds after its workers' calls failed. Until then Ray's actor table still holds the worker as
    alive (a worker that died alone is recorded dead by its raylet at once), so the verdict is waited for while it
    does, at most `wait_s`."""
    if node is None:
        return None
    deadline = time.monotonic() + (wait_s or 0.0)
    while True:
        # read first: Ray records a node's death before its actors'
        recorded_alive = calls.actor_state(actor) == "ALIVE"
        if lost := calls.lost_node(node):
            return lost
        if not recorded_alive or time.monotonic() >= deadline or (interrupted is not None and interrupted()):
            return None
        time.sleep(SLICE_S)


def checkpoint_at_node_loss(node: str, lost: str | None, learner_node: str | None, write: Callable[[], object]) -> None:
    """Node `lost` (named `node`) is gone and the run ends: where the learner lives on another node, its state now
    is written (`write`), so a resume continues from here rather than from the last periodic checkpoint. A save
    that fails is logged; the run ends with its line all the same."""
    if learner_node in (None, lost):
        return
    log.warning("%s was lost: checkpointing before the run ends", node)
    try:
        write()
    except Exception as error:  # noqa: BLE001 - the newest periodic checkpoint remains
        log.warning("no checkpoint at the node's loss: %s", _first_line(error))


def node_lost_line(node: str, roles: list[str], waited_s: float | None, run_dir: Path | None) -> str:
    """The one line that ends a run whose node was lost: the node, every role it held, and how to go on."""
    resume = f"rlfarm train resume={run_dir}" if run_dir else "rlfarm train resume=<run_dir>"
    return (f"{node} was lost with {', '.join(roles)}: not restarted elsewhere"
            f"{f' within {waited_s:g} s' if waited_s is not None else ''}; bring the node back (or pick a topology "
            f"without it) and resume from the newest checkpoint: {resume}")


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__

"""Watch the restartable workers (env runners, labelers) of a run: notice when one dies, hand it back to the
loop for recovery, and keep the bookkeeping that makes counters survive a restart.

Ray restarts a dead actor by running its constructor again (`max_restarts`), so it comes back with empty
state: no peers, no counters, no chunks. What the dead incarnation did is known exactly from the learner,
which counts settled transitions per (runner, incarnation) and delivered ones per (labeler, incarnation);
this module adds those to the live incarnations' own counters. The learner is not restarted: its state is
the run's state, and a checkpoint + `resume` is how it comes back."""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import ray

log = logging.getLogger("rlfarm")

SEQS_PER_EPOCH = 10**9        # chunk seqs of the k-th resume of a run begin at k·10⁹ ...
SEQS_PER_INCARNATION = 10**7  # ... and those of a runner's i-th restart within it at i·10⁷: ids never collide
MAX_INCARNATIONS = SEQS_PER_EPOCH // SEQS_PER_INCARNATION


class WorkerLost(RuntimeError):
    """A worker died and may not be restarted again (or did not come back)."""


@dataclass
class Worker:
    kind: str                         # "env_runner" | "labeler"
    index: int
    actor: ray.actor.ActorHandle
    incarnation: int = 0
    restarts: int = 0
    done: ray.ObjectRef | None = None  # the ref of its running `run()` call
    pid: int | None = None
    stats: dict = field(default_factory=dict)  # the newest stats of the live incarnation

    @property
    def name(self) -> str:
        return f"{self.kind} {self.index}"


def first_seq(epoch: int, incarnation: int) -> int:
    return epoch * SEQS_PER_EPOCH + incarnation * SEQS_PER_INCARNATION


def incarnation_key(epoch: int, incarnation: int) -> int:
    """What the learner files a runner's chunks under: seq // SEQS_PER_INCARNATION."""
    return first_seq(epoch, incarnation) // SEQS_PER_INCARNATION


def died(ref: ray.ObjectRef) -> BaseException | None:
    """The actor-death error a finished `run()` ref holds, or None if it returned (or failed otherwise)."""
    try:
        ray.get(ref, timeout=0)
    except ray.exceptions.RayActorError as error:  # ActorUnavailableError too: dead and being restarted
        return error
    except Exception:  # noqa: BLE001 - a role's own exception is not a death; the loop reports it
        return None
    return None


class Supervisor:
    def __init__(self, runners: list, labelers: list, max_restarts: int, roles_file: Path | None = None):
        self.workers = [Worker("env_runner", i, a) for i, a in enumerate(runners)] + \
                       [Worker("labeler", i, a) for i, a in enumerate(labelers)]
        self.max_restarts = max_restarts
        self.roles_file = roles_file
        self.recoveries: list[dict] = []

    def of(self, kind: str) -> list[Worker]:
        return [w for w in self.workers if w.kind == kind]

    def dead(self) -> list[Worker]:
        """Workers whose `run()` ended with the actor's death."""
        ready, _ = ray.wait([w.done for w in self.workers], num_returns=len(self.workers), timeout=0)
        ready = set(ready)
        return [w for w in self.workers if w.done in ready and died(w.done) is not None]

    def poll(self, timeout_s: float = 2.0) -> list[dict]:
        """Refresh each worker's stats; returns the fresh ones. A worker that is dead or restarting keeps its
        last stats; stats from a new incarnation the loop has not recovered yet are ignored (the pid tells)."""
        refs = {w.actor.stats.remote(): w for w in self.workers}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        fresh = []
        for ref in ready:
            worker = refs[ref]
            try:
                stats = ray.get(ref)
            except ray.exceptions.RayError:
                continue
            if worker.pid is None or stats["pid"] == worker.pid:
                worker.pid, worker.stats = stats["pid"], stats
                fresh.append(stats)
        return fresh

    def wait_until_back(self, worker: Worker, timeout_s: float) -> int:
        """Block until Ray has restarted the worker; returns its new pid."""
        if worker.restarts >= self.max_restarts or worker.incarnation + 1 >= MAX_INCARNATIONS:
            raise WorkerLost(f"{worker.name} died and run.max_restarts={self.max_restarts} is used up "
                             f"(raise it, or resume the run: rlfarm train resume=<run_dir>)")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                stats = ray.get(worker.actor.stats.remote(), timeout=max(deadline - time.monotonic(), 0.1))
            except ray.exceptions.ActorDiedError as error:
                raise WorkerLost(f"{worker.name} died and was not restarted: {_first_line(error)}") from None
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                time.sleep(0.2)
                continue
            if stats["pid"] != worker.pid:
                return stats["pid"]
            time.sleep(0.1)  # the old incarnation's pid: Ray has not noticed the death yet
        raise WorkerLost(f"{worker.name} died and did not come back within {timeout_s:g} s")

    def restarted(self, worker: Worker, new_pid: int, started: float, detail: dict) -> None:
        """Record a finished recovery (the loop has re-wired the worker and called `run()` again)."""
        record = {"role": worker.kind, "index": worker.index, "pid_before": worker.pid, "pid_after": new_pid,
                  "recovery_s": round(time.monotonic() - started, 3), **detail}
        worker.restarts += 1
        worker.incarnation += 1
        worker.pid, worker.stats = new_pid, {}
        self.recoveries.append(record)
        log.warning("%s (pid %s) died; restarted as pid %d and back at work in %.2f s%s", worker.name,
                    record["pid_before"], new_pid, record["recovery_s"],
                    "".join(f", {k.replace('_', ' ')} {v}" for k, v in detail.items()))
        self.write_roles_file()

    def write_roles_file(self) -> None:
        """`roles.json` in the run dir: which process runs which worker now (for `kill`, py-spy, tests)."""
        if self.roles_file is None:
            return
        table = [{"role": w.kind, "index": w.index, "pid": w.pid, "incarnation": w.incarnation,
                  "restarts": w.restarts} for w in self.workers]
        tmp = self.roles_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(table, indent=1))
        tmp.replace(self.roles_file)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__

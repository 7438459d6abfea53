"""Watch the restartable workers (env runners, labelers) of an off-policy run: notice when one dies, hand it
back to the loop for re-wiring, and keep the bookkeeping that makes counters survive a restart.

Ray restarts a dead actor by running its constructor again (`max_restarts`), so it comes back with empty
state: no peers, no counters, no chunks. What its dead incarnations did comes from two sources: the learner
counts settled transitions per (runner, incarnation key) and delivered ones per (labeler, incarnation), and a
runner's last stats report says how many env steps it took. `Supervisor` adds those to the live incarnations'
own counts (`dead_env_steps`, `settled_by_dead`, `delivered_by_dead`) and gives a restarted runner what is left
of its share of the env steps (`successor_budget`, `tighten_budgets`). The learner is not restarted: its state
is the run's state, and a checkpoint + `resume` is how it comes back.

No wait on a role is open-ended (rlfarm/loops/deadlines.py). `poll` keeps one stats request per role in flight and never waits past its `wait_s`; `unresponsive` names the
roles whose request is older than the deadline, the labelers stuck in one reward-model call for longer (a
labeler reports `in_call_s` from another thread of its threaded actor) and the VLA rollout workers whose rollout
has not moved for longer (`stalled_s`, from their watch thread). `kill` hands such a worker to Ray
for a restart (the recovery path then re-wires it as after any death), or ends the run when restarts are used up."""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import ray

from rlfarm.loops.deadlines import NO_PROGRESS, SLICE_S, WorkerLost, died

log = logging.getLogger("rlfarm")

SEQS_PER_EPOCH = 10**9        # chunk seqs of the k-th resume of a run begin at k·10⁹ ...
SEQS_PER_INCARNATION = 10**7  # ... and those of a runner's i-th restart within it at i·10⁷: ids never collide
MAX_INCARNATIONS = SEQS_PER_EPOCH // SEQS_PER_INCARNATION


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

    @property
    def name(self) -> str:
        return f"{self.kind} {self.index}"


def first_seq(epoch: int, incarnation: int) -> int:
    return epoch * SEQS_PER_EPOCH + incarnation * SEQS_PER_INCARNATION


def incarnation_key(epoch: int, incarnation: int) -> int:
    """What the learner files a runner's chunks under: seq // SEQS_PER_INCARNATION."""
    return first_seq(epoch, incarnation) // SEQS_PER_INCARNATION


class Supervisor:
    def __init__(self, learner, runners: list, labelers: list, max_restarts: int, roles_file: Path | None = None,
                 engines: list = ()):
        # the learner is watched (stats, deadline) but never restarted: it is not among `workers`
        self.learner = Worker("learner", 0, learner)
        self.workers = [Worker("env_runner", i, a) for i, a in enumerate(runners)] + \
                       [Worker("labeler", i, a) for i, a in enumerate(labelers)] + \
                       [Worker("engine", i, a) for i, a in enumerate(engines)]
        self.max_restarts = max_restarts
        self.roles_file = roles_file
        self.recoveries: list[dict] = []
        self.epoch = 0                          # the run's resume count: part of every runner incarnation key
        self.shares: list[int] = []             # env steps each runner index takes in this epoch
        # (runner index, incarnation key) of each dead runner incarnation → the env steps it last reported.
        self._reported_by_dead: dict[tuple[int, int], int] = {}
        self._budgets: dict[int, int] = {}      # runner index → the env-step budget its live incarnation got

    def start_epoch(self, epoch: int, shares: list[int]) -> None:
        """The run (or its `epoch`-th resume) starts: runner i takes shares[i] env steps."""
        self.epoch, self.shares = epoch, shares

    def runner_key(self, worker: Worker, incarnation: int | None = None) -> int:
        """The key the learner files this runner incarnation's chunks under (default: the live one)."""
        return incarnation_key(self.epoch, worker.incarnation if incarnation is None else incarnation)

    def of(self, kind: str) -> list[Worker]:
        return [w for w in self.workers if w.kind == kind]

    def dead(self) -> list[Worker]:
        """Workers whose `run()` ended with the actor's death."""
        ready = self._ended()
        return [w for w in self.workers if w.done in ready and died(w.done) is not None]

    def poll(self, wait_s: float) -> list[Worker]:
        """Refresh the stats of every role (learner first); returns the roles whose stats are fresh. Each role has
        at most one stats request in flight: one that has not answered yet is waited for again next time (its age
        is what `unresponsive` judges). A worker that is dead or restarting keeps its last stats; stats from a new
        incarnation the loop has not recovered yet are ignored (the pid tells)."""
        roles, now = [self.learner, *self.workers], time.monotonic()
        for role in roles:
            if role.asked is None:
                role.asked = (role.actor.stats.remote(), now)
        refs = {role.asked[0]: role for role in roles}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=wait_s)
        fresh = []
        for ref in ready:
            role = refs[ref]
            role.asked = None
            try:
                stats = ray.get(ref)
            except ray.exceptions.RayError:
                continue
            if role.pid is None or stats["pid"] == role.pid:
                role.pid, role.stats = stats["pid"], stats
                fresh.append(role)
        return fresh

    def unresponsive(self, deadline_s: float, warmup_s: float) -> list[tuple[Worker, str]]:
        """(role, what is wrong) for each live role whose stats request is older than `deadline_s`, and each
        labeler that has been in one reward-model call for longer (`warmup_s` for a labeler not warm yet: its model
        may be compiling). Dead workers and those already handed to Ray for a restart are the recovery's business,
        not this."""
        ended, now = self._ended(), time.monotonic()
        roles = [role for role in [self.learner, *self.workers] if not role.killed and role.done not in ended]
        # an old request may have been answered since the last poll (the loop was busy elsewhere): not late
        old = [role.asked[0] for role in roles if role.asked is not None and now - role.asked[1] > deadline_s]
        _, late = ray.wait(old, num_returns=len(old), timeout=0) if old else ([], [])
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
        ray.kill(worker.actor, no_restart=False)

    def wait_until_back(self, worker: Worker, timeout_s: float, interrupted: Callable[[], bool] | None = None) -> int:
        """Block until Ray has restarted the worker (at most `timeout_s`; Interrupted when `interrupted()` turns
        true meanwhile); returns its new pid."""
        if not self._may_restart(worker):
            raise WorkerLost(f"{worker.name} died and run.max_restarts={self.max_restarts} is used up "
                             f"(raise it, or resume the run: rlfarm train resume=<run_dir>)")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if interrupted is not None and interrupted():
                raise Interrupted(f"{worker.name} was not waited for")
            try:
                stats = ray.get(worker.actor.stats.remote(), timeout=min(max(deadline - time.monotonic(), 0.1), 1.0))
            except ray.exceptions.ActorDiedError as error:
                raise WorkerLost(f"{worker.name} died and was not restarted: {_first_line(error)}") from None
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                time.sleep(SLICE_S)
                continue
            if stats["pid"] != worker.pid:
                return stats["pid"]
            time.sleep(0.1)  # the old incarnation's pid: Ray has not noticed the death yet
        raise WorkerLost(f"{worker.name} died and did not come back within {timeout_s:g} s")

    def _may_restart(self, worker: Worker) -> bool:
        return worker.restarts < self.max_restarts and worker.incarnation + 1 < MAX_INCARNATIONS

    def running(self, roles: list[Worker]) -> list[Worker]:
        """Those of `roles` whose `run()` has not ended."""
        ended = self._ended()
        return [w for w in roles if w.done not in ended]

    def _ended(self) -> set:
        """The `run()` refs that are ready: the worker returned, failed, or died."""
        refs = [w.done for w in [self.learner, *self.workers] if w.done is not None]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
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

    # -- counts of dead incarnations ---------------------------------------------------------------------
    def runner_lost(self, worker: Worker) -> None:
        """A runner incarnation died: keep the env steps it last reported."""
        self._reported_by_dead[(worker.index, self.runner_key(worker))] = int(worker.stats.get("env_steps", 0))

    def successor_budget(self, index: int, learner: dict) -> int:
        """Env steps the next incarnation of runner `index` may take: its share less what the dead ones took."""
        self._budgets[index] = self._runner_budget(index, learner)
        return self._budgets[index]

    def tighten_budgets(self, learner: dict) -> None:
        """A dead runner's last chunks can reach the learner after its successor started: lower the
        successor's step budget by them, so the run never takes more than total_env_steps."""
        for worker in self.of("env_runner"):
            if worker.index in self._budgets:
                budget = self._runner_budget(worker.index, learner)
                if budget < self._budgets[worker.index]:
                    self._budgets[worker.index] = budget
                    worker.actor.set_budget.remote(budget)

    def dead_env_steps(self, learner: dict) -> int:
        """Env steps all dead runner incarnations took (this epoch)."""
        return sum(self._dead_runner_steps(index, learner) for index in {i for i, _ in self._reported_by_dead})

    def settled_by_dead(self, learner: dict) -> int:
        """Transitions stored or quarantined that dead runner incarnations produced (this epoch)."""
        live = {(w.index, self.runner_key(w)) for w in self.of("env_runner")}
        return sum(n for key, n in learner["settled_by_runner"].items() if key not in live)

    def delivered_by_dead(self, learner: dict) -> int:
        """Transitions dead labeler incarnations delivered to the learner."""
        live = {(w.index, w.incarnation) for w in self.of("labeler")}
        return sum(n for key, n in learner["delivered_by_labeler"].items() if key not in live)

    def _dead_runner_steps(self, index: int, learner: dict) -> int:
        """Env steps the dead incarnations of runner `index` took: what they last reported, or more if more of
        their chunks reached the learner since (the report is up to one metrics interval old)."""
        settled = learner["settled_by_runner"]
        return sum(max(reported, settled.get(key, 0)) for key, reported in self._reported_by_dead.items()
                   if key[0] == index)

    def _runner_budget(self, index: int, learner: dict) -> int:
        return max(self.shares[index] - self._dead_runner_steps(index, learner), 0)

    def write_roles_file(self) -> None:
        """`roles.json` in the run dir: which process runs which worker now (for `kill`, py-spy, tests)."""
        if self.roles_file is None:
            return
        table = [{"role": w.kind, "index": w.index, "pid": w.pid, "incarnation": w.incarnation,
                  "restarts": w.restarts} for w in [self.learner, *self.workers]]
        tmp = self.roles_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(table, indent=1))
        tmp.replace(self.roles_file)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__

"""Every wait of a driver on a role has a deadline, and names the role that missed it.

`ask` is `ray.get` with a deadline: it raises `RoleUnresponsive` naming the first role that did not answer in time,
and `Interrupted` as soon as the run must end (SIGTERM, `run.max_wall_s`), checked every SLICE_S. `died` tells a
role's death (Ray restarts it, or it is gone) from its own exception. Every family's loop waits through these.

Long work (a generation of long answers, a big update) may rightly take longer than any deadline, so a wait on
it is given `alive` (name → the role as `Watched`): the deadline is then on the role's liveness, not on the work.
While the work runs, each role still working is asked `stats()` (answered from its "watch" thread, `WATCH`), and
one whose stats do not come back within `timeout_s` is named, with its pid. A call that fails (a role died) fails
the wait at once, without waiting for the others."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import ray

WATCH = {"watch": 1}  # the concurrency group a role's stats() answers from while its other calls run
# A role whose calls are sent before their inputs exist (a scorer, handed the engine's rollout ref): in Ray's
# in-order actor queue its stats() would wait behind such a call (a first GPU generate compiles for over a
# minute: "did not answer stats"). Only for roles whose calls are independent of each other's order.
FED_BY_REFS = {"allow_out_of_order_execution": True}



class RoleFailed(RuntimeError):
    """A role failed in a way that ends the run; the message is the one line the user reads."""


class WorkerLost(RoleFailed):
    """A worker died and may not be restarted again (or did not come back)."""


class RoleUnresponsive(RoleFailed):
    """A role did not answer a call within its deadline."""


class RoleDied(RoleFailed):
    """A role died during a call (Ray may be restarting it); `role` is its name in the wait."""

    def __init__(self, role: str, message: str):
        super().__init__(message)
        self.role = role


class Interrupted(RuntimeError):
    """A wait was cut short because the run must end now (SIGTERM, or run.max_wall_s)."""


NO_PROGRESS = "made no progress in its rollout"  # a worker that answers stats, but whose rollout does not move
SLICE_S = 0.2  # a long wait looks at its `interrupted` flag this often


def ask(calls: list[tuple[str, ray.ObjectRef]], what: str, timeout_s: float,
        interrupted: Callable[[], bool] | None = None, alive: dict | None = None) -> list:
    """`ray.get` of several roles' answers, each named (e.g. ("labeler 2", ref)), within `timeout_s`; raises
    RoleUnresponsive naming the first role that did not answer `what` in time, Interrupted when `interrupted()`
    turns true meanwhile (checked every SLICE_S), and a failed call's error as soon as it fails (with `alive`: a
    role's death as RoleDied, naming it).
    alive: name → `Watched`, for calls whose work may take longer than `timeout_s`: no deadline on the work, but
    each role still working must answer `stats()` within `timeout_s` (`Liveness`)."""
    refs = [ref for _, ref in calls]
    deadline = time.monotonic() + timeout_s
    liveness = Liveness(alive, timeout_s) if alive else None
    checked: set = set()
    while True:
        left = deadline - time.monotonic()
        slice_s = SLICE_S if liveness is not None else max(min(left, SLICE_S), 0)
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=slice_s)
        for name, ref in calls:
            if ref in ready and ref not in checked:  # a call that failed fails the wait now, not after the slowest
                checked.add(ref)
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError:
                    if liveness is None:
                        raise
                    raise RoleDied(name, f"{described(name, alive[name]) if name in alive else name} died "
                                         f"during {what}") from None
        if not pending:
            return ray.get(refs)
        if interrupted is not None and interrupted():
            raise Interrupted(f"stopped waiting for {what}")
        late = {name for name, ref in calls if ref in set(pending)}
        if liveness is not None:
            liveness.check(late)
        elif left <= 0:
            raise RoleUnresponsive(f"{next(name for name, _ in calls if name in late)} did not answer {what} "
                                   f"within {timeout_s:g} s")


@dataclass
class Watched:
    """A role a driver waits on: its actor (whose `stats()` answers from the "watch" thread) and its process id,
    read from its stats (a restarted role has a new one)."""
    actor: ray.actor.ActorHandle
    pid: int | None = None


class Liveness:
    """The stats probes of the roles a long wait depends on: at most one in flight per role, a new one once the
    last answered and half the deadline has passed; `check` raises RoleUnresponsive naming a role (and its pid,
    once known) whose probe has not answered within the deadline. A probe that fails (the role died) is
    dropped: the role's own call fails too, and the caller handles that."""

    def __init__(self, roles: dict[str, Watched], timeout_s: float):
        self.roles, self.timeout_s = roles, timeout_s
        self.asked: dict[str, tuple[ray.ObjectRef, float]] = {}  # name → (probe in flight, asked at)
        self.answered: dict[str, float] = {}                      # name → when its last probe answered

    def check(self, working: set[str]) -> None:
        now = time.monotonic()
        for name in sorted(working & set(self.roles)):
            role = self.roles[name]
            if name in self.asked:
                probe, asked_at = self.asked[name]
                if ray.wait([probe], timeout=0)[0]:
                    del self.asked[name]
                    self.answered[name] = now
                    try:
                        role.pid = int(ray.get(probe)["pid"])
                    except ray.exceptions.RayError:
                        pass  # died: its call fails as well
                elif now - asked_at > self.timeout_s:
                    raise RoleUnresponsive(f"{described(name, role)} did not answer stats within {self.timeout_s:g} s")
            if name not in self.asked and now - self.answered.get(name, -1e9) >= self.timeout_s / 2:
                self.asked[name] = (role.actor.stats.remote(), now)


def described(name: str, role: Watched) -> str:
    """"learner (pid 1234)": how a line names a role."""
    return f"{name} (pid {role.pid})" if role.pid else name


def ask_one(who: str, ref: ray.ObjectRef, what: str, timeout_s: float,
            interrupted: Callable[[], bool] | None = None, alive: Watched | None = None):
    """`ask` of one role; alive: the role, for work that may outlast `timeout_s` (the deadline on its stats)."""
    return ask([(who, ref)], what, timeout_s, interrupted, None if alive is None else {who: alive})[0]


def died(ref: ray.ObjectRef) -> BaseException | None:
    """The actor-death error a finished `run()` ref holds, or None if it returned (or failed otherwise)."""
    try:
        ray.get(ref, timeout=0)
    except ray.exceptions.RayActorError as error:  # ActorUnavailableError too: dead and being restarted
        return error
    except Exception:  # noqa: BLE001 - a role's own exception is not a death; the loop reports it
        return None
    return None

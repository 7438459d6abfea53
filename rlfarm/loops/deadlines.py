"""Every wait of a driver on a role has a deadline, and names the role that missed it.

`ask` is `ray.get` with a deadline: it raises `RoleUnresponsive` naming the first role that did not answer in time,
and `Interrupted` as soon as the run must end (SIGTERM, `run.max_wall_s`), checked every SLICE_S. `died` tells a
role's death (Ray restarts it, or it is gone) from its own exception. Every family's loop waits through these."""
from __future__ import annotations

import time
from typing import Callable

import ray


class RoleFailed(RuntimeError):
    """A role failed in a way that ends the run; the message is the one line the user reads."""


class WorkerLost(RoleFailed):
    """A worker died and may not be restarted again (or did not come back)."""


class RoleUnresponsive(RoleFailed):
    """A role did not answer a call within its deadline."""


class Interrupted(RuntimeError):
    """A wait was cut short because the run must end now (SIGTERM, or run.max_wall_s)."""


NO_PROGRESS = "made no progress in its rollout"  # a worker that answers stats, but whose rollout does not move
SLICE_S = 0.2  # a long wait looks at its `interrupted` flag this often


def ask(calls: list[tuple[str, ray.ObjectRef]], what: str, timeout_s: float,
        interrupted: Callable[[], bool] | None = None) -> list:
    """`ray.get` of several roles' answers, each named (e.g. ("labeler 2", ref)), within `timeout_s`; raises
    RoleUnresponsive naming the first role that did not answer `what` in time, Interrupted when `interrupted()`
    turns true meanwhile (checked every SLICE_S)."""
    refs = [ref for _, ref in calls]
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=max(min(left, SLICE_S), 0))
        if not pending:
            return ray.get(refs)
        if interrupted is not None and interrupted():
            raise Interrupted(f"stopped waiting for {what}")
        if left <= 0:
            late = next(name for name, ref in calls if ref in set(pending))
            raise RoleUnresponsive(f"{late} did not answer {what} within {timeout_s:g} s")


def ask_one(who: str, ref: ray.ObjectRef, what: str, timeout_s: float,
            interrupted: Callable[[], bool] | None = None):
    return ask([(who, ref)], what, timeout_s, interrupted)[0]


def died(ref: ray.ObjectRef) -> BaseException | None:
    """The actor-death error a finished `run()` ref holds, or None if it returned (or failed otherwise)."""
    try:
        ray.get(ref, timeout=0)
    except ray.exceptions.RayActorError as error:  # ActorUnavailableError too: dead and being restarted
        return error
    except Exception:  # noqa: BLE001 - a role's own exception is not a death; the loop reports it
        return None
    return None

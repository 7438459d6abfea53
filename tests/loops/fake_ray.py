"""Stand-ins for Ray in the drivers' unit tests: fake roles and the calls the supervisor and the off-policy loop
make through their seam (rlfarm/loops/ray_calls.py), answered in-process, so the logic runs in milliseconds.

A `FakeActor` wraps a plain role object: `actor.stats.remote()` calls `role.stats()` now and returns a `FakeRef`
of its answer. A method that returns a FakeRef itself (a pending `run()`) hands that ref out, and a role can
`hang()` (its calls never answer) or `die()` (pending and later calls fail with a RayActorError, as a dead actor's
do; Ray restarts it when `restart` says so: a new role object from the factory, with a new pid)."""
from __future__ import annotations

import itertools
import time
from concurrent.futures import Future

from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError

from rlfarm.loops.deadlines import RoleUnresponsive

PIDS = itertools.count(1000)
_PENDING = object()


class FakeRef:
    def __init__(self, value=_PENDING):
        self.value, self.error = value, None

    @property
    def ready(self) -> bool:
        return self.value is not _PENDING or self.error is not None

    def set(self, value) -> None:
        self.value = value

    def fail(self, error: BaseException) -> None:
        if not self.ready:
            self.error = error

    def result(self):
        if self.error is not None:
            raise self.error
        return self.value

    def future(self) -> Future:
        future = Future()
        if self.error is not None:
            future.set_exception(self.error)
        elif self.ready:
            future.set_result(self.value)
        return future


class _Method:
    def __init__(self, actor: FakeActor, name: str):
        self.actor, self.name = actor, name

    def remote(self, *args, **kwargs) -> FakeRef:
        actor = self.actor
        actor.calls.append((self.name, args, kwargs))
        if actor.gone is not None:
            ref = FakeRef()
            ref.fail(actor.gone)
            return ref
        if actor.hung:
            ref = FakeRef()
        else:
            answer = getattr(actor.role, self.name)(*args, **kwargs)
            ref = answer if isinstance(answer, FakeRef) else FakeRef(answer)
        if not ref.ready:
            actor.pending.append(ref)
        return ref


class FakeActor:
    def __init__(self, make_role, restart: bool = True):
        self.make_role, self.restart = make_role, restart
        self.calls: list[tuple[str, tuple, dict]] = []  # every call made on it, across incarnations
        self.pending: list[FakeRef] = []
        self.incarnations = 0
        self._start()

    def _start(self) -> None:
        self.pid = next(PIDS)
        self.role = self.make_role(self.pid)
        self.hung, self.gone, self.pending = False, None, []
        self.incarnations += 1

    def __getattr__(self, name: str) -> _Method:
        return _Method(self, name)

    def called(self, name: str) -> list[tuple]:
        return [args for method, args, _ in self.calls if method == name]

    def hang(self) -> None:
        self.hung = True

    def die(self) -> None:
        """The process dies: every call in flight fails; Ray brings up a new one (if `restart`), else it is gone."""
        for ref in self.pending:
            ref.fail(RayActorError())
        if self.restart:
            self._start()
        else:
            self.gone = ActorDiedError()


class FakeCalls:
    """The seam's calls over FakeRefs. `on_wait` moves the fake world on while the driver waits (a wait with a
    timeout); an answer that is not there is not waited for (the fakes answer at once, or never)."""

    def __init__(self, on_wait=None):
        self.on_wait = on_wait
        self.killed: list[FakeActor] = []
        self.nodes: dict[int, str] = {}  # id(actor) → the node it runs on (none: unknown)
        self.lost: dict[str, str] = {}   # node id → how a line names it, once "Ray" has declared it dead

    def wait(self, refs, num_returns=1, timeout=None):
        if timeout and self.on_wait is not None:
            self.on_wait()
        ready = [ref for ref in refs if ref.ready][:num_returns]
        return ready, [ref for ref in refs if ref not in ready]

    def get(self, ref, timeout=None):
        if isinstance(ref, list):
            return [self.get(one, timeout) for one in ref]
        if not ref.ready:
            raise GetTimeoutError("not ready")
        return ref.result()

    def kill(self, actor: FakeActor, no_restart: bool = True) -> None:
        self.killed.append(actor)
        actor.restart = actor.restart and not no_restart
        actor.die()

    def ask(self, calls, what, timeout_s, interrupted=None):
        late = next((name for name, ref in calls if not ref.ready), None)
        if late is not None:
            raise RoleUnresponsive(f"{late} did not answer {what} within {timeout_s:g} s")
        return [ref.result() for _, ref in calls]

    def ask_one(self, who, ref, what, timeout_s, interrupted=None):
        return self.ask([(who, ref)], what, timeout_s, interrupted)[0]

    def died(self, ref: FakeRef):
        return ref.error if isinstance(ref.error, RayActorError) else None

    def node_of(self, actor: FakeActor) -> str | None:
        return self.nodes.get(id(actor))

    def lost_node(self, node_id: str) -> str | None:
        return self.lost.get(node_id)


def wait_past(seconds: float) -> None:
    """Let a real deadline pass (the supervisor ages stats requests by time.monotonic)."""
    time.sleep(seconds)

"""`ask` with a liveness probe, against tiny actors on a real local Ray: a role that answers; one whose work outlasts
the deadline but whose stats answer (waited for); one whose stats do not answer (named, with its pid, within the
deadline); one that dies (named at once); SIGTERM's flag (ends the wait at once); and a plain deadline on the
answer."""
import os
import sys
import threading
import time

import pytest
import ray

from rlfarm.loops.deadlines import WATCH, Interrupted, RoleDied, RoleUnresponsive, Watched, ask, ask_one

TIMEOUT_S = 1.0


class Worker:
    def __init__(self):
        self.hung = threading.Event()

    def work(self, seconds: float) -> str:
        time.sleep(seconds)
        return "done"

    def hang(self) -> None:
        """Its stats stop answering too, as a SIGSTOPped process's do."""
        self.hung.set()

    def die(self) -> None:
        time.sleep(0.3)
        os._exit(1)

    @ray.method(concurrency_group="watch")
    def stats(self) -> dict:
        if self.hung.is_set():
            time.sleep(60)
        return {"pid": os.getpid()}


@pytest.fixture(scope="module")
def ray_local():
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test module
    ray.init(address="local", num_cpus=4, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             configure_logging=False)
    yield ray
    ray.shutdown()


def started(ray) -> tuple:
    actor = ray.remote(concurrency_groups=WATCH)(Worker).remote()
    pid = ray.get(actor.stats.remote())["pid"]
    return actor, Watched(actor, pid)


def test_an_answer_within_the_deadline(ray_local):
    actor, role = started(ray_local)
    assert ask([("worker", actor.work.remote(0.1))], "work", TIMEOUT_S) == ["done"]
    assert ask_one("worker", actor.work.remote(0.1), "work", TIMEOUT_S, alive=role) == "done"


def test_work_longer_than_the_deadline_is_waited_for_while_the_role_answers_stats(ray_local):
    actor, role = started(ray_local)
    began = time.monotonic()
    assert ask_one("worker", actor.work.remote(3 * TIMEOUT_S), "work", TIMEOUT_S, alive=role) == "done"
    assert time.monotonic() - began >= 3 * TIMEOUT_S
    with pytest.raises(RoleUnresponsive, match=r"worker did not answer work within 1 s"):  # no probe: on the work
        ask_one("worker", actor.work.remote(3 * TIMEOUT_S), "work", TIMEOUT_S)


def test_a_role_whose_stats_do_not_answer_is_named_with_its_pid_within_the_deadline(ray_local):
    actor, role = started(ray_local)
    ray_local.get(actor.hang.remote())
    began = time.monotonic()
    with pytest.raises(RoleUnresponsive, match=rf"^worker \(pid {role.pid}\) did not answer stats within 1 s$"):
        ask_one("worker", actor.work.remote(30), "work", TIMEOUT_S, alive=role)
    assert time.monotonic() - began < 3 * TIMEOUT_S
    ray_local.kill(actor)


def test_a_role_that_dies_is_named_at_once(ray_local):
    actor, role = started(ray_local)
    _, other = started(ray_local)
    calls = [("slow", other.actor.work.remote(30)), ("worker", actor.die.remote())]
    with pytest.raises(RoleDied, match=rf"worker \(pid {role.pid}\) died during work") as death:
        ask(calls, "work", TIMEOUT_S, alive={"worker": role, "slow": other})
    assert death.value.role == "worker"
    ray_local.kill(other.actor)


def test_an_interrupt_ends_the_wait_at_once(ray_local):
    actor, role = started(ray_local)
    stop_at = time.monotonic() + 0.5
    with pytest.raises(Interrupted):
        ask_one("worker", actor.work.remote(30), "work", TIMEOUT_S, lambda: time.monotonic() > stop_at, alive=role)
    assert time.monotonic() - stop_at < 0.5
    ray_local.kill(actor)

"""The supervisor and the off-policy ledger against fake roles (no Ray): workers that die, hang (no stats answer)
or stall are named, killed for a restart and recorded back; a dead runner's env steps are kept and its successor
gets the rest of its share. Seconds, not minutes: the end-to-end fault tests are test_worker_failure.py and
test_offpolicy_deadlines.py."""
import json
import time

import pytest
from fake_ray import FakeActor, FakeCalls, FakeRef, wait_past

from rlfarm.loops.deadlines import NO_PROGRESS, Interrupted, WorkerLost
from rlfarm.loops.ledger import MAX_INCARNATIONS, SEQS_PER_EPOCH, Ledger, first_seq, incarnation_key
from rlfarm.loops.supervision import Supervisor


class Role:
    """Answers stats with its pid and whatever the test puts in `extra`; run() stays pending until set."""

    def __init__(self, pid: int):
        self.pid, self.extra, self.done = pid, {}, FakeRef()

    def stats(self) -> dict:
        return {"pid": self.pid, **self.extra}

    def run(self) -> FakeRef:
        return self.done

    def set_budget(self, env_steps: int) -> None:
        self.budget = env_steps


def supervisor(tmp_path=None, runners=2, labelers=1, engines=0, max_restarts=3, max_incarnations=None,
               restart=True) -> Supervisor:
    actor = lambda: FakeActor(Role, restart=restart)  # noqa: E731
    sup = Supervisor(actor(), [actor() for _ in range(runners)], [actor() for _ in range(labelers)], max_restarts,
                     None if tmp_path is None else tmp_path / "roles.json", engines=[actor() for _ in range(engines)],
                     max_incarnations=max_incarnations, calls=FakeCalls())
    for role in [sup.learner, *sup.workers]:
        role.done = role.actor.run.remote()
    return sup


def test_poll_keeps_one_request_per_role_and_ignores_an_unrecovered_incarnation():
    sup = supervisor()
    assert {w.name for w in sup.poll(0.0)} == {"learner 0", "env_runner 0", "env_runner 1", "labeler 0"}
    runner0, runner1 = sup.of("env_runner")
    pids = {w.name: w.pid for w in sup.workers}
    assert pids["env_runner 0"] == runner0.actor.pid
    runner1.actor.hang()
    assert runner1 not in sup.poll(0.0)
    asked = len(runner1.actor.called("stats"))
    sup.poll(0.0)
    assert len(runner1.actor.called("stats")) == asked  # the unanswered request is waited for, not asked again
    before = runner0.stats
    runner0.actor.die()  # Ray restarted it; the loop has not recovered it yet
    assert runner0 not in sup.poll(0.0)
    assert runner0.pid == pids["env_runner 0"] and runner0.stats is before


def test_unresponsive_names_a_role_whose_stats_request_is_older_than_the_deadline():
    sup = supervisor()
    sup.poll(0.0)
    runner1 = sup.of("env_runner")[1]
    runner1.actor.hang()
    sup.poll(0.0)
    assert sup.unresponsive(0.05, 1.0) == []  # asked just now
    wait_past(0.06)
    assert sup.unresponsive(0.05, 1.0) == [(runner1, "did not answer stats within 0.05 s")]
    runner1.asked[0].set({"pid": runner1.pid})  # answered since, while the loop was busy elsewhere: not late
    assert sup.unresponsive(0.05, 1.0) == []


def test_unresponsive_names_a_labeler_in_one_model_call_and_a_stalled_rollout():
    sup = supervisor(engines=1)
    labeler, engine = sup.of("labeler")[0], sup.of("engine")[0]
    labeler.actor.role.extra = {"in_call_s": 5.0}
    engine.actor.role.extra = {"stalled_s": 1.0}
    sup.poll(0.0)
    assert [(w.name, p) for w, p in sup.unresponsive(2.0, 10.0)] == [
        ("labeler 0", "has been in one reward-model call for 5 s (run.role_timeout_s=2)")]
    labeler.actor.role.extra = {"in_call_s": 5.0, "warm": False}  # its model may be compiling: the warm-up limit
    engine.actor.role.extra = {"stalled_s": 3.0}
    sup.poll(0.0)
    assert [(w.name, p) for w, p in sup.unresponsive(2.0, 10.0)] == [
        ("engine 0", f"{NO_PROGRESS} for 3 s (run.role_timeout_s=2)")]
    labeler.actor.role.extra = {"in_call_s": 11.0, "warm": False}
    sup.poll(0.0)
    assert ("labeler 0", "has been in one reward-model call for 11 s (one of its first calls: "
                         "run.restart_timeout_s=10)") in [(w.name, p) for w, p in sup.unresponsive(2.0, 10.0)]


def test_a_killed_worker_is_dead_then_back_with_a_new_pid_and_recorded(tmp_path):
    sup = supervisor(tmp_path)
    sup.poll(0.0)
    runner = sup.of("env_runner")[0]
    old_pid = runner.pid
    runner.actor.hang()
    sup.poll(0.0)
    wait_past(0.06)
    (role, problem), = sup.unresponsive(0.05, 1.0)
    sup.kill(role, problem)
    assert sup.calls.killed == [runner.actor] and runner.killed
    assert sup.dead() == [runner]                     # its run() failed with the actor's death
    assert runner not in sup.running(sup.workers)
    assert sup.unresponsive(0.05, 1.0) == []          # the recovery's business now, not a second kill
    new_pid = sup.wait_until_back(runner, timeout_s=1.0)
    assert new_pid == runner.actor.pid != old_pid
    started = time.monotonic()
    runner.done = runner.actor.run.remote()
    sup.restarted(runner, new_pid, started, {"env_steps_left": 7})
    assert (runner.incarnation, runner.restarts, runner.stats, runner.killed) == (1, 1, {}, False)
    record, = sup.recoveries
    assert record["role"] == "env_runner" and record["pid_before"] == old_pid and record["pid_after"] == new_pid
    assert record["env_steps_left"] == 7 and record["recovery_s"] >= 0
    table = {(r["role"], r["index"]): r for r in json.loads((tmp_path / "roles.json").read_text())}
    assert table[("env_runner", 0)]["pid"] == new_pid and table[("env_runner", 0)]["incarnation"] == 1
    assert runner in sup.poll(0.0) and runner.stats["pid"] == new_pid  # the new incarnation's stats count now
    assert sup.dead() == []


def test_restarts_are_bounded_by_max_restarts_and_max_incarnations():
    sup = supervisor(max_restarts=1)
    sup.poll(0.0)
    runner = sup.of("env_runner")[0]
    runner.actor.die()
    sup.restarted(runner, sup.wait_until_back(runner, 1.0), time.monotonic(), {})
    with pytest.raises(WorkerLost, match="env_runner 0 hangs, and run.max_restarts=1 is used up"):
        sup.kill(runner, "hangs")
    with pytest.raises(WorkerLost, match="run.max_restarts=1 is used up"):
        sup.wait_until_back(runner, 1.0)
    capped = supervisor(max_restarts=10, max_incarnations=2)
    runner = capped.of("env_runner")[0]
    runner.incarnation = 1
    with pytest.raises(WorkerLost):
        capped.kill(runner, "hangs")


def test_wait_until_back_names_a_worker_gone_late_or_given_up():
    sup = supervisor(restart=False)
    sup.poll(0.0)
    gone, late = sup.of("env_runner")
    gone.actor.die()
    with pytest.raises(WorkerLost, match="env_runner 0 died and was not restarted"):
        sup.wait_until_back(gone, 1.0)
    late.actor.hang()
    with pytest.raises(Interrupted):
        sup.wait_until_back(late, 1.0, interrupted=lambda: True)
    with pytest.raises(WorkerLost, match="env_runner 1 died and did not come back within 0.3 s"):
        sup.wait_until_back(late, 0.3)


def test_dead_tells_a_death_from_a_return():
    sup = supervisor()
    returned, died = sup.of("env_runner")
    returned.actor.role.done.set({"produced": 3})
    died.actor.die()
    assert sup.dead() == [died]
    assert sup.running(sup.workers) == sup.of("labeler")


def test_seqs_of_epochs_and_incarnations_never_collide():
    assert first_seq(0, 0) == 0 and first_seq(2, 3) == 2 * SEQS_PER_EPOCH + 3 * first_seq(0, 1)
    keys = {incarnation_key(epoch, i) for epoch in range(3) for i in range(MAX_INCARNATIONS)}
    assert len(keys) == 3 * MAX_INCARNATIONS
    assert first_seq(0, MAX_INCARNATIONS) == first_seq(1, 0)  # why a runner has at most MAX_INCARNATIONS


def test_ledger_keeps_a_dead_runners_steps_and_gives_its_successor_the_rest():
    sup = supervisor()
    ledger = Ledger(sup)
    ledger.start_epoch(1, [100, 100])
    runner0, runner1 = sup.of("env_runner")
    dead_key, live_key = ledger.runner_key(runner0), ledger.runner_key(runner1)
    assert dead_key == incarnation_key(1, 0)
    runner0.stats = {"env_steps": 30}
    ledger.runner_lost(runner0)
    learner = {"settled_by_runner": {(0, dead_key): 24, (1, live_key): 50}, "delivered_by_labeler": {}}
    assert ledger.dead_env_steps(learner) == 30  # its last report: more than reached the learner yet
    assert ledger.successor_budget(0, learner) == 70
    sup.restarted(runner0, 4242, time.monotonic(), {})
    assert ledger.runner_key(runner0) == incarnation_key(1, 1) and ledger.first_seq(1) == first_seq(1, 1)
    learner["settled_by_runner"][(0, dead_key)] = 40  # the dead one's last chunks arrive after its successor started
    learner["settled_by_runner"][(0, ledger.runner_key(runner0))] = 5
    assert ledger.dead_env_steps(learner) == 40
    assert ledger.settled_by_dead(learner) == 40  # the live incarnations' keys are not the dead's
    ledger.tighten_budgets(learner)
    assert runner0.actor.called("set_budget") == [(60,)] and runner1.actor.called("set_budget") == []
    ledger.tighten_budgets(learner)
    learner["settled_by_runner"][(0, dead_key)] = 35  # never raised again
    ledger.tighten_budgets(learner)
    assert runner0.actor.called("set_budget") == [(60,)]


def test_ledger_counts_what_dead_labeler_incarnations_delivered():
    sup = supervisor(labelers=2)
    ledger = Ledger(sup)
    sup.of("labeler")[0].incarnation = 1
    learner = {"settled_by_runner": {}, "delivered_by_labeler": {(0, 0): 7, (0, 1): 3, (1, 0): 11}}
    assert ledger.delivered_by_dead(learner) == 7

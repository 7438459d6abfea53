"""The off-policy loop's stages against a fake farm (no Ray): the runners' shares of the env steps, the tail
flushed, the learner's progress watched, stop conditions (budget, target return, a dead or hung learner), a dead
runner's or labeler's recovery, and the metrics row and summary. Each run takes milliseconds; the end-to-end runs
with real roles are test_offpolicy_pipeline.py, test_worker_failure.py and test_sac_learns.py."""
import json
import logging
import re

import pytest
from fake_ray import FakeActor, FakeCalls, FakeRef
from omegaconf import OmegaConf

from rlfarm.loops.deadlines import RoleFailed
from rlfarm.loops.ledger import first_seq, incarnation_key
from rlfarm.loops.offpolicy import OffPolicyLoop
from rlfarm.loops.roles import OffPolicyRoles
from rlfarm.run import Run

CHUNK = 10  # env steps a fake runner takes per tick


class Runner:
    def __init__(self, pid, farm, index):
        self.pid, self.farm, self.index = pid, farm, index
        self.budget, self.key, self.env_steps, self.produced, self.stopped = None, None, 0, 0, False
        self.returns: list[float] = []
        self.done = FakeRef()

    def run(self, max_env_steps, first_seq, key, random_steps=None):
        self.budget, self.first_seq, self.key, self.random_steps = max_env_steps, first_seq, key, random_steps
        return self.done

    def tick(self):
        steps = min(CHUNK, self.budget - self.env_steps) if self.budget is not None else 0
        if self.budget is not None and (self.stopped or steps <= 0):
            self.done.set({"produced": self.produced})
        elif steps > 0:
            self.env_steps += steps
            self.produced += steps
            self.returns.append(self.farm.episode_return)
            self.farm.deliver(self.index, self.key, steps)

    def stats(self):
        returns, self.returns = self.returns, []
        return {"pid": self.pid, "env_steps": self.env_steps, "produced": self.produced, "in_flight": 0,
                "episode_returns": returns, "stage_s": {"step": 0.01 * self.env_steps, "credit_wait": 0.02 * self.env_steps}}

    def stop(self):
        self.stopped = True

    def set_budget(self, env_steps):
        self.budget = env_steps

    def set_labelers(self, labelers):
        pass

    def redispatch(self, labeler):
        """Chunks it had sent that labeler and not had acked, sent again."""
        return self.farm.resend(self.index, labeler)


class Labeler:
    def __init__(self, pid, farm, index):
        self.pid, self.incarnation, self.labeled, self.done = pid, 0, 0, FakeRef()
        self.wired = False  # Ray's restart runs the constructor again: no learner until set_learner

    def run(self):
        return self.done

    def stop(self):
        self.done.set({})

    def set_learner(self, ranks, incarnation=0):
        self.incarnation, self.wired = incarnation, True

    def stats(self):
        return {"pid": self.pid, "labeled": self.labeled, "queued": 0, "in_call_s": 0.0,
                "stage_s": {"model": 0.02 * self.labeled, "idle": 0.001}}


class Learner:
    def __init__(self, pid, farm):
        self.pid, self.stored, self.updates, self.done = pid, 0, 0, FakeRef()
        self.settled_by_runner, self.delivered_by_labeler, self.saved = {}, {}, []

    def run(self):
        return self.done

    def stop(self):
        self.done.set({})

    def push_weights(self):
        pass

    def save(self, path, with_buffer, extra):
        self.saved.append((path, extra))
        return path

    def stats(self):
        return {"pid": self.pid, "stored": self.stored, "quarantined": 0, "updates": self.updates,
                "duplicate_transitions": 0, "buffer_size": self.stored, "policy_version": self.updates,
                "policy_staleness": 0.0, "duplicates": 0, "critic_loss": 0.5,
                "settled_by_runner": dict(self.settled_by_runner),
                "delivered_by_labeler": dict(self.delivered_by_labeler),
                "stage_s": {"update": 0.001 * self.updates, "idle": 0.01 * self.updates}}


class Farm:
    """Each tick (the driver waits for the runners) every runner with budget left takes CHUNK env steps, which are
    labeled (runner i's by labeler i mod L) and stored `label_ticks` ticks later (None: never), one update per
    chunk; a chunk sent to a labeler not wired yet (restarted) waits at its runner until `redispatch`.
    `events[tick]` runs first. The learner is not restarted when it dies (no max_restarts), the others are."""

    def __init__(self, runners=2, labelers=1, episode_return=0.0, label_ticks=0):
        self.episode_return, self.ticks, self.events = episode_return, 0, {}
        self.label_ticks, self.labeling = label_ticks, []  # (due tick, runner, key, steps)
        self.learner = FakeActor(lambda pid: Learner(pid, self), restart=False)
        self.runners = [FakeActor(lambda pid, i=i: Runner(pid, self, i)) for i in range(runners)]
        self.labelers = [FakeActor(lambda pid, i=i: Labeler(pid, self, i)) for i in range(labelers)]
        for labeler in self.labelers:  # as start_offpolicy_roles wires them
            labeler.role.set_learner([self.learner])
        self.calls = FakeCalls(on_wait=self.tick)
        self.unacked: list[tuple[int, int, int]] = []  # (runner, key, steps) sent to a labeler that lost them

    def tick(self):
        self.ticks += 1
        self.events.pop(self.ticks, lambda: None)()
        due = [chunk for chunk in self.labeling if chunk[0] <= self.ticks]
        self.labeling = [chunk for chunk in self.labeling if chunk[0] > self.ticks]
        for _, *chunk in due:
            self.store(*chunk)
        for runner in self.runners:
            if not runner.hung:
                runner.role.tick()

    def resend(self, runner, labeler):
        held = [chunk for chunk in self.unacked if chunk[0] == runner]
        self.unacked = [chunk for chunk in self.unacked if chunk[0] != runner]
        for chunk in held:
            self.deliver(*chunk)
        return len(held)

    def deliver(self, runner, key, steps):
        if self.label_ticks is None:
            return  # lost on the way: never labeled
        if self.label_ticks:
            self.labeling.append((self.ticks + self.label_ticks, runner, key, steps))
        else:
            self.store(runner, key, steps)

    def store(self, runner, key, steps):
        labeler = self.labelers[runner % len(self.labelers)]
        if not labeler.role.wired:
            self.unacked.append((runner, key, steps))
            return
        labeler.role.labeled += steps
        learner = self.learner.role
        learner.stored += steps
        learner.updates += 1
        learner.settled_by_runner[(runner, key)] = learner.settled_by_runner.get((runner, key), 0) + steps
        by = (self.labelers.index(labeler), labeler.role.incarnation)
        learner.delivered_by_labeler[by] = learner.delivered_by_labeler.get(by, 0) + steps

    def loop(self, tmp_path, total_env_steps=200, resume_from=None, target=None, **run) -> OffPolicyLoop:
        cfg = OmegaConf.create({
            "total_env_steps": total_env_steps, "algo": {"name": "sac", "family": "offpolicy", "target_return": target},
            "env": {"id": "Fake-v0"}, "topology": {"name": "fake"}, "logger": {"tensorboard": False},
            "run": {"role_timeout_s": 5.0, "restart_timeout_s": 5.0, "max_restarts": 2, "metrics_interval_s": 0.01,
                    "max_wall_s": 0, "checkpoint_every_updates": 0, "checkpoint_every_min": 0,
                    "checkpoint_buffer": False, "live": False, **run}})
        roles = OffPolicyRoles(self.learner, self.runners, self.labelers)
        return OffPolicyLoop(cfg, Run(cfg, tmp_path), None, resume_from, start_roles=lambda *_: roles,
                             calls=self.calls)


@pytest.fixture
def no_signal_grace(monkeypatch):
    """A run that fails waits SIGNAL_GRACE_S for a SIGTERM that may explain it; none comes here."""
    monkeypatch.setattr("rlfarm.loops.checkpoints.SIGNAL_GRACE_S", 0.0)


def rows(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def test_a_run_shares_the_env_steps_and_accounts_for_every_transition(tmp_path):
    farm = Farm(runners=3)
    summary = farm.loop(tmp_path, total_env_steps=200).train()
    assert [r.role.budget for r in farm.runners] == [67, 67, 66]
    assert [r.role.first_seq for r in farm.runners] == [0, 0, 0]
    assert summary["env_steps"] == summary["transitions_produced"] == summary["transitions_stored"] == 200
    assert summary["transitions_labeled"] == 200 and summary["transitions_unlabeled"] == 0
    assert summary["updates"] == farm.learner.role.updates and summary["worker_restarts"] == 0
    assert farm.learner.called("stop") and all(labeler.called("stop") for labeler in farm.labelers)
    assert farm.learner.role.saved == []  # no periodic checkpoint asked for; final.pt is the caller's
    logged = rows(tmp_path)
    assert logged[-1]["env_steps"] == 200 and logged[-1]["critic_loss"] == 0.5
    at_work = logged[1]  # every role at work (the first row has no earlier stage times to grow from)
    assert at_work["runner_busy_fraction"] == pytest.approx(1 / 3) and at_work["learner_busy_fraction"] < 0.1
    assert at_work["bottleneck"] == "labelers 100 % busy"
    roles = json.loads((tmp_path / "roles.json").read_text())
    assert {(r["role"], r["pid"]) for r in roles} == {
        (kind, actor.pid) for kind, actors in (("learner", [farm.learner]), ("env_runner", farm.runners),
                                               ("labeler", farm.labelers)) for actor in actors}


def test_the_tail_still_at_the_labelers_is_stored_before_the_learner_stops(tmp_path):
    farm = Farm(runners=2, label_ticks=3)
    summary = farm.loop(tmp_path, total_env_steps=100).train()
    assert summary["transitions_stored"] == summary["transitions_labeled"] == 100
    assert summary["transitions_unlabeled"] == 0


def test_a_tail_that_never_arrives_is_given_up_on_and_counted(tmp_path, caplog):
    farm = Farm(runners=2, label_ticks=None)
    with caplog.at_level(logging.WARNING, logger="rlfarm"):
        summary = farm.loop(tmp_path, total_env_steps=100, role_timeout_s=0.1).train()
    assert summary["transitions_produced"] == summary["transitions_unlabeled"] == 100
    assert any("100 of 100 transitions produced were not labeled" in r.message for r in caplog.records)


def test_run_max_wall_s_stops_the_runners_and_ends_the_run(tmp_path):
    farm = Farm(runners=2)
    summary = farm.loop(tmp_path, total_env_steps=10**9, max_wall_s=0.3).train()
    assert all(runner.called("stop") for runner in farm.runners)
    assert 0 < summary["env_steps"] == summary["transitions_stored"] < 10**9
    assert summary["wall_s"] < 15  # within the wind-down


def test_a_resumed_run_takes_only_the_steps_left_in_a_new_seq_epoch(tmp_path):
    farm = Farm(runners=2)
    learner = farm.learner.role
    learner.stored, learner.updates = 120, 12
    extra = {"episodes": 4, "epoch": 0, "wall_s": 30.0, "window": [1.0], "timings": {}}
    learner.load = lambda path: extra
    summary = farm.loop(tmp_path, total_env_steps=200, resume_from="step_000000012.pt").train()
    assert [r.role.budget for r in farm.runners] == [40, 40]
    assert [r.role.first_seq for r in farm.runners] == [first_seq(1, 0)] * 2
    assert [r.role.key for r in farm.runners] == [incarnation_key(1, 0)] * 2
    assert summary["env_steps"] == summary["transitions_produced"] == summary["transitions_stored"] == 200
    assert summary["restarts"] == 1 and summary["transitions_unlabeled"] == 0


def test_a_dead_runner_is_restarted_with_the_rest_of_its_share(tmp_path):
    farm = Farm(runners=2)
    farm.events[3] = farm.runners[1].die  # after 20 of its 100 steps
    summary = farm.loop(tmp_path, total_env_steps=200).train()
    successor = farm.runners[1]
    assert successor.incarnations == 2
    record, = summary["recoveries"]
    assert (record["role"], record["index"], record["env_steps_left"]) == ("env_runner", 1, 80)
    assert (successor.role.budget, successor.role.first_seq, successor.role.key) == (80, first_seq(0, 1), 1)
    assert successor.role.random_steps == 0  # the learner is updating: the successor acts with the policy
    assert summary["env_steps"] == summary["transitions_stored"] == summary["transitions_produced"] == 200
    assert summary["worker_restarts"] == 1 and summary["transitions_unlabeled"] == 0
    assert farm.learner.called("push_weights")
    steps = [row["env_steps"] for row in rows(tmp_path)]
    assert steps == sorted(steps)  # the dead incarnation's steps still count after its successor starts


def test_a_hung_runner_is_killed_restarted_and_finishes_its_share(tmp_path):
    farm = Farm(runners=2)
    farm.events[2] = farm.runners[0].hang  # after 10 of its 100 steps
    summary = farm.loop(tmp_path, total_env_steps=200, role_timeout_s=0.2).train()
    assert farm.calls.killed == [farm.runners[0]]
    record, = summary["recoveries"]
    assert (record["role"], record["index"], record["env_steps_left"]) == ("env_runner", 0, 90)
    assert summary["env_steps"] == summary["transitions_stored"] == 200


def test_a_dead_labeler_is_rewired_and_its_chunks_resent(tmp_path):
    farm = Farm(runners=2)
    farm.events[2] = farm.labelers[0].die
    summary = farm.loop(tmp_path, total_env_steps=100).train()
    record, = summary["recoveries"]
    assert (record["role"], record["chunks_resent"]) == ("labeler", 2)  # one chunk of each runner was lost
    assert farm.labelers[0].role.incarnation == 1
    assert all(runner.called("redispatch") == [(0,)] for runner in farm.runners)
    # what its dead incarnation delivered still counts: the run labeled every transition it produced
    assert summary["transitions_labeled"] == summary["transitions_produced"] == 100


def test_the_target_return_stops_the_runners_early(tmp_path):
    farm = Farm(runners=2, episode_return=50.0)
    summary = farm.loop(tmp_path, total_env_steps=10_000, target=40.0).train()
    assert summary["reached_target"] and summary["target_return"] == 40.0
    assert all(runner.called("stop") for runner in farm.runners)
    assert summary["env_steps"] < 10_000 and summary["transitions_unlabeled"] == 0


def test_a_dead_learner_ends_the_run_with_the_resume_command(tmp_path, no_signal_grace):
    farm = Farm()
    farm.events[2] = farm.learner.die
    loop = farm.loop(tmp_path)
    with pytest.raises(RoleFailed, match=re.escape(f"the learner died; resume from its last checkpoint: "
                                                   f"rlfarm train resume={tmp_path}")):
        loop.train()


def test_a_hung_learner_ends_the_run_within_the_deadline(tmp_path, no_signal_grace):
    farm = Farm()
    farm.events[2] = farm.learner.hang
    loop = farm.loop(tmp_path, total_env_steps=10**9, role_timeout_s=0.2)
    with pytest.raises(RoleFailed, match="the learner did not answer stats within 0.2 s; resume"):
        loop.train()


def test_a_stalled_learner_is_named_once_and_waited_for(tmp_path, caplog):
    farm = Farm()
    loop = farm.loop(tmp_path, role_timeout_s=0.05)
    watch = loop.learner_watch
    loop.supervisor.learner.stats = {"updates": 3, "stored": 30, "owed": 5}
    watch.look()
    watch.seen = (watch.seen[0], watch.seen[1] - 1.0)  # a second without progress, past the deadline
    with caplog.at_level(logging.INFO, logger="rlfarm"):
        watch.look()
        watch.look()
        stalled = [r.message for r in caplog.records if "made no progress" in r.message]
        assert len(stalled) == 1 and "5 updates owed" in stalled[0]
        loop.supervisor.learner.stats = {"updates": 4, "stored": 30, "owed": 5}
        watch.look()
    assert any("making progress again" in r.message for r in caplog.records)
    loop.supervisor.learner.stats = {"updates": 4, "stored": 30, "owed": 0}
    assert watch.work(loop.supervisor.learner.stats) is None  # nothing waits for it: idle, not stalled


def test_chunks_not_acked_wait_for_the_learner_only_while_no_labeler_holds_any(tmp_path):
    farm = Farm(runners=2)
    loop = farm.loop(tmp_path)
    runners, (labeler,) = loop.supervisor.of("env_runner"), loop.supervisor.of("labeler")
    runners[0].stats, runners[1].stats, labeler.stats = {"in_flight": 3}, {"in_flight": 1}, {"queued": 0}
    assert loop.learner_watch.work({"updates": 1, "stored": 10}) == "4 chunks not acked"
    labeler.stats = {"queued": 2}  # they are at the labeler: nothing waits for the learner
    assert loop.learner_watch.work({"updates": 1, "stored": 10}) is None

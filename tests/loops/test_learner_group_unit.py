"""The learner group's logic against fake ranks (no Ray): the driver, not rank 0, speaks to every rank. An
off-policy run with two actor-learner ranks starts, stops and watches both and reports their counts summed; a rank
that dies or hangs ends the run naming it; a checkpoint is rank 0's file with the other ranks' parts, and every rank
loads it (the LM learner's ranks all take the save call instead). Milliseconds; the end-to-end runs with real ranks
are test_actor_learner_cartpole.py (APPO, two ranks, preempted and resumed) and test_worker_failure.py (IMPALA)."""
import json
import re

import pytest
import test_offpolicy_loop_unit
from fake_ray import FakeActor, FakeCalls, wait_past
from test_offpolicy_loop_unit import Farm, Learner

from rlfarm.loops.deadlines import RoleFailed
from rlfarm.loops.learner_group import LearnerGroup
from rlfarm.loops.roles import OffPolicyRoles
from rlfarm.loops.supervision import Supervisor
from rlfarm.roles.actor_learner import ActorLearner


class Rank(Learner):
    """A fake actor-learner rank: its counters, and its part of rank 0's checkpoint."""

    def save_part(self):
        return {"stored": self.stored}

    def save(self, path, extra=None, *parts, with_buffer=True):
        self.saved.append((path, extra, parts))
        return path

    def load(self, path):
        return {"from": path}


class TwoRanks(Farm):
    """The farm with two learner ranks: runner i's chunks are stored by rank i mod 2 (as the labelers route them)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.learner = FakeActor(lambda pid: Rank(pid, self), restart=False)
        self.ranks = [self.learner, FakeActor(lambda pid: Rank(pid, self), restart=False)]

    def store(self, runner, key, steps):
        lead, self.learner = self.learner, self.ranks[runner % 2]
        try:
            super().store(runner, key, steps)
        finally:
            self.learner = lead



@pytest.fixture
def two_ranks(monkeypatch):
    """The farm's roles as `start_offpolicy_roles` returns them for two actor-learner ranks."""
    farm = TwoRanks()
    group = LearnerGroup(farm.ranks, learner_class=ActorLearner)
    monkeypatch.setattr(test_offpolicy_loop_unit, "OffPolicyRoles",
                        lambda learner, runners, labelers: OffPolicyRoles(learner, runners, labelers, group))
    return farm


@pytest.fixture
def no_signal_grace(monkeypatch):
    monkeypatch.setattr("rlfarm.loops.checkpoints.SIGNAL_GRACE_S", 0.0)


def test_the_driver_runs_stops_and_counts_every_rank(tmp_path, two_ranks):
    summary = two_ranks.loop(tmp_path, total_env_steps=200).train()
    lead, other = (rank.role for rank in two_ranks.ranks)
    assert lead.stored > 0 and other.stored > 0  # each rank stored its runner's chunks ...
    assert summary["transitions_stored"] == lead.stored + other.stored == summary["env_steps"] == 200  # ... summed
    assert summary["learner_ranks"] == 2 and summary["transitions_unlabeled"] == 0
    for rank in two_ranks.ranks:  # the driver, not rank 0, starts and stops every rank
        assert rank.called("run") and rank.called("stop")
    roles = json.loads((tmp_path / "roles.json").read_text())
    assert [(r["role"], r["index"]) for r in roles if r["role"] == "learner"] == [("learner", 0), ("learner", 1)]


def test_a_dead_rank_ends_the_run_naming_it(tmp_path, two_ranks, no_signal_grace):
    two_ranks.events[2] = two_ranks.ranks[1].die
    with pytest.raises(RoleFailed, match=re.escape(f"learner rank 1 died; resume from its last checkpoint: "
                                                   f"rlfarm train resume={tmp_path}")):
        two_ranks.loop(tmp_path).train()


def test_a_hung_rank_ends_the_run_within_the_deadline(tmp_path, two_ranks, no_signal_grace):
    two_ranks.events[2] = two_ranks.ranks[1].hang
    with pytest.raises(RoleFailed, match="learner rank 1 did not answer stats within 0.2 s; resume"):
        two_ranks.loop(tmp_path, total_env_steps=10**9, role_timeout_s=0.2).train()


def test_rank_zero_writes_the_other_ranks_parts_and_every_rank_loads(tmp_path, two_ranks):
    group = LearnerGroup(two_ranks.ranks, learner_class=ActorLearner)
    two_ranks.ranks[1].role.stored = 7
    ((name, ref),) = group.save_calls("a.pt", {"updates": 3}, with_buffer=False)
    assert name == "learner" and ref.result() == "a.pt"
    ((path, extra, (part,)),) = two_ranks.ranks[0].role.saved
    assert (path, extra) == ("a.pt", {"updates": 3}) and part.result() == {"stored": 7}  # Ray resolves the ref
    assert not two_ranks.ranks[1].role.saved
    assert [name for name, _ in group.load_calls("a.pt")] == ["learner", "learner rank 1"]
    assert all(rank.called("load") == [("a.pt",)] for rank in two_ranks.ranks)


def test_ranks_that_save_together_all_take_the_call():
    """An LM learner's ranks (no `save_part`): every rank takes `save` (under FSDP they gather the shards)."""
    class Together:
        def __init__(self, pid):
            self.pid = pid

        def save(self, path, extra=None):
            return path if self.pid == ranks[0].pid else None

    ranks = [FakeActor(Together), FakeActor(Together)]
    group = LearnerGroup(ranks, learner_class=Together)
    calls = group.save_calls("b.pt", {})
    assert [name for name, _ in calls] == ["learner", "learner rank 1"] and calls[0][1].result() == "b.pt"
    assert group.merge_stats({"stored": 1}, [{"stored": 2}]) == {"stored": 1}  # the ranks count alike: rank 0's


def test_merged_stats_are_rank_zeros_with_the_newest_counts_of_the_others(two_ranks):
    sup = Supervisor(two_ranks.ranks[0], [], [], 0, calls=FakeCalls(), learner_ranks=two_ranks.ranks[1:],
                     merge_stats=ActorLearner.merge_rank_stats)
    lead, other = (rank.role for rank in two_ranks.ranks)
    lead.stored, other.stored = 5, 7
    assert sup.poll(0.0) == [sup.learner]  # rank 1 answered too, but rank 0 reports for the learner
    assert sup.learner.stats["stored"] == 12 and sup.learner.stats["learner_ranks"] == 2
    two_ranks.ranks[0].hang()
    other.stored = 9
    sup.poll(0.0)
    assert sup.learner.stats["stored"] == 14  # rank 0's newest (5) with rank 1's newer count
    wait_past(0.05)
    assert [w.name for w, _ in sup.unresponsive(0.01, 1.0)] == ["learner 0"]

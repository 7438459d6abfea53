"""A lost node, against fake roles (no Ray): roles.json records each role's node; a worker whose node Ray declared
dead is waited for at most `lost_node_wait_s`, then one line names the node and every role it held; out of
restarts (run.max_restarts=0) the line still names the node. The same in the synchronous (LLM) loop, which first
checkpoints when its learner survives. The real node loss is tests/multinode/test_two_nodes.py."""
import json
import time
from types import SimpleNamespace

import pytest
from fake_ray import FakeActor, FakeCalls
from omegaconf import OmegaConf

from rlfarm.loops.deadlines import Watched, WorkerLost
from rlfarm.loops.progress import Progress
from rlfarm.loops.skeleton import SyncLoop
from rlfarm.loops.supervision import NodeLost, Supervisor
from test_supervisor_unit import Role

NODE_A, NODE_B = "a" * 56, "b" * 56


class NodeCalls(FakeCalls):
    """FakeCalls whose "Ray" declares a node dead only after `verdict_after` looks (its health checks take
    seconds), and whose actor table holds a worker on a switched-off node as alive until then."""

    def __init__(self, verdict_after: int = 3):
        super().__init__()
        self.verdict_after, self.looks = verdict_after, 0
        self.switched_off: dict[str, str] = {}  # node id → its line, once Ray's verdict is in

    def lost_node(self, node_id: str) -> str | None:
        self.looks += node_id in self.switched_off
        if node_id in self.switched_off and self.looks >= self.verdict_after:
            self.lost[node_id] = self.switched_off[node_id]
        return super().lost_node(node_id)

    def actor_state(self, actor: FakeActor) -> str:
        gone = actor.gone is not None or actor.hung
        return "ALIVE" if not gone or self.nodes.get(id(actor)) in self.switched_off.keys() - self.lost.keys() \
            else "DEAD"


def two_node_supervisor(tmp_path, lost_node_wait_s, checkpoint=None, max_restarts=3):
    """The learner and a runner on node A, two labelers on node B; out of restarts, Ray does not restart them."""
    calls = NodeCalls()
    actor = lambda: FakeActor(Role, restart=max_restarts > 0)  # noqa: E731
    sup = Supervisor(actor(), [actor()], [actor(), actor()], max_restarts, tmp_path / "roles.json", calls=calls,
                     lost_node_wait_s=lost_node_wait_s, checkpoint=checkpoint)
    calls.nodes = {id(sup.learner.actor): NODE_A, id(sup.of("env_runner")[0].actor): NODE_A,
                   **{id(w.actor): NODE_B for w in sup.of("labeler")}}
    sup.poll(0.0)
    sup.write_roles_file()
    return sup, calls


def test_roles_json_records_each_roles_node(tmp_path):
    two_node_supervisor(tmp_path, 1.0)
    rows = json.loads((tmp_path / "roles.json").read_text())
    assert {(r["role"], r["index"]): r["node"] for r in rows} == {
        ("learner", 0): NODE_A, ("env_runner", 0): NODE_A, ("labeler", 0): NODE_B, ("labeler", 1): NODE_B}


def test_a_worker_on_a_lost_node_is_waited_for_briefly_then_the_node_and_its_roles_are_named(tmp_path):
    saved = []
    sup, calls = two_node_supervisor(tmp_path, lost_node_wait_s=0.5, checkpoint=lambda: saved.append("step"))
    labeler = sup.of("labeler")[0]
    labeler.actor.hang()  # Ray's restart waits for a node that holds node_b: none does any more
    calls.lost[NODE_B] = "node bbbbbbbb (10.0.0.2, node_b)"
    started = time.monotonic()
    with pytest.raises(WorkerLost) as lost:
        sup.wait_until_back(labeler, timeout_s=60)
    assert time.monotonic() - started < 5  # lost_node_wait_s, not restart_timeout_s
    assert str(lost.value).startswith("node bbbbbbbb (10.0.0.2, node_b) was lost with labeler 0, labeler 1: not "
                                      "restarted elsewhere within 0.5 s")
    assert f"resume={tmp_path}" in str(lost.value)
    assert saved == ["step"]  # the learner lives on node A: its state at the loss is written before the run ends


def test_no_checkpoint_when_the_lost_node_held_the_learner(tmp_path):
    saved = []
    sup, calls = two_node_supervisor(tmp_path, lost_node_wait_s=0.2, checkpoint=lambda: saved.append("step"))
    runner = sup.of("env_runner")[0]
    runner.actor.hang()
    calls.lost[NODE_A] = "node aaaaaaaa (10.0.0.1, node_a)"
    with pytest.raises(WorkerLost, match="was lost with the learner, env_runner 0"):
        sup.wait_until_back(runner, timeout_s=60)
    assert saved == []


def test_a_worker_whose_node_lives_is_waited_for_as_before(tmp_path):
    sup, _ = two_node_supervisor(tmp_path, lost_node_wait_s=0.1)
    labeler = sup.of("labeler")[0]
    labeler.actor.hang()
    with pytest.raises(WorkerLost, match="labeler 0 died and did not come back within 0.5 s"):
        sup.wait_until_back(labeler, timeout_s=0.5)


def test_out_of_restarts_a_worker_on_a_lost_node_still_names_the_node(tmp_path):
    """run.max_restarts=0: the death is not waited on for a restart, but for Ray's word on the node (the worker's
    calls fail seconds before Ray declares its node dead), and the line names the node and its roles."""
    sup, calls = two_node_supervisor(tmp_path, lost_node_wait_s=5.0, max_restarts=0)
    for labeler in sup.of("labeler"):
        labeler.actor.die()
    calls.switched_off[NODE_B] = "node bbbbbbbb (10.0.0.2, node_b)"
    with pytest.raises(WorkerLost, match=r"^node bbbbbbbb \(10.0.0.2, node_b\) was lost with labeler 0, labeler 1"):
        sup.wait_until_back(sup.of("labeler")[0], timeout_s=60)
    assert calls.looks >= 3  # it waited for the verdict


def test_out_of_restarts_a_worker_that_died_alone_ends_the_run_at_once(tmp_path):
    sup, _ = two_node_supervisor(tmp_path, lost_node_wait_s=30.0, max_restarts=0)
    labeler = sup.of("labeler")[0]
    labeler.actor.die()
    started = time.monotonic()
    with pytest.raises(WorkerLost, match="labeler 0 died and run.max_restarts=0 is used up"):
        sup.wait_until_back(labeler, timeout_s=60)
    assert time.monotonic() - started < 1  # its node lives: Ray's table says dead, nothing to wait for


class EngineAndScorer(SyncLoop):
    """The synchronous loop's restart path on its own: an LLM run's learner on node A, its engine and scorer on
    node B (topology=two_node_cpu), fake roles; a checkpoint is whatever `_save` is handed."""

    def __init__(self, tmp_path, calls: FakeCalls, max_restarts: int = 3):
        self.cfg = OmegaConf.create({"run": {"role_timeout_s": 0.5, "restart_timeout_s": 60,
                                             "max_restarts": max_restarts}})
        self.run = SimpleNamespace(dir=tmp_path, checkpoint_dir=tmp_path / "checkpoints")
        self.calls, self.saved = calls, []
        self.watched = {name: Watched(FakeActor(Role)) for name in ("learner", "engine 0", "labeler 0")}
        calls.nodes = {id(self.watched["learner"].actor): NODE_A, id(self.watched["engine 0"].actor): NODE_B,
                       id(self.watched["labeler 0"].actor): NODE_B}
        self.restartable = {"engine 0", "labeler 0"}
        self.restarts, self.nodes = dict.fromkeys(self.watched, 0), {}
        self.progress = Progress(window=2, updates=7)
        for role in self.watched.values():
            role.pid = role.actor.pid
        self._write_roles_file()

    def _save(self, path: str, extra: dict) -> str:
        self.saved.append((path, extra["updates"]))
        return path


@pytest.mark.parametrize("max_restarts", [3, 0])
def test_the_llm_loop_names_a_lost_node_and_its_roles_and_checkpoints_first(tmp_path, max_restarts):
    calls = NodeCalls(verdict_after=2)
    loop = EngineAndScorer(tmp_path, calls, max_restarts)
    rows = json.loads((tmp_path / "roles.json").read_text())
    assert {(r["role"], r["node"]) for r in rows} == {("learner", NODE_A), ("engine", NODE_B), ("labeler", NODE_B)}
    for name in ("engine 0", "labeler 0"):
        loop.watched[name].actor.hang()  # Ray's restart waits for a node that holds node_b: none does any more
    calls.switched_off[NODE_B] = "node bbbbbbbb (10.0.0.2, node_b)"
    started = time.monotonic()
    with pytest.raises(NodeLost) as lost:
        loop._restarted("engine 0")
    assert time.monotonic() - started < 5  # run.role_timeout_s, not run.restart_timeout_s
    assert str(lost.value).startswith("node bbbbbbbb (10.0.0.2, node_b) was lost with engine 0, labeler 0: ")
    assert f"resume={tmp_path}" in str(lost.value)
    # the learner lives on node A: the run's state at the loss is on disk, so a resume loses no update
    assert loop.saved == [(str(tmp_path / "checkpoints" / "step_000000007.pt"), 7)]


def test_the_llm_loop_restarts_an_engine_whose_node_lives(tmp_path):
    loop = EngineAndScorer(tmp_path, NodeCalls())
    engine = loop.watched["engine 0"]
    before = engine.pid
    engine.actor.die()  # Ray restarts it at once, with a new pid
    loop._restarted("engine 0")
    assert engine.pid != before and loop.restarts["engine 0"] == 1 and loop.saved == []

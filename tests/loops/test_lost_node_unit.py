"""A lost node, against fake roles (no Ray): roles.json records each role's node; a worker whose node Ray declared
dead is waited for at most `lost_node_wait_s`, then one line names the node and every role it held. The real
node loss is tests/multinode/test_two_nodes.py."""
import json
import time

import pytest
from fake_ray import FakeActor, FakeCalls

from rlfarm.loops.deadlines import WorkerLost
from rlfarm.loops.supervision import Supervisor
from test_supervisor_unit import Role

NODE_A, NODE_B = "a" * 56, "b" * 56


def two_node_supervisor(tmp_path, lost_node_wait_s):
    calls = FakeCalls()
    actor = lambda: FakeActor(Role)  # noqa: E731
    sup = Supervisor(actor(), [actor()], [actor(), actor()], 3, tmp_path / "roles.json", calls=calls,
                     lost_node_wait_s=lost_node_wait_s)
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
    sup, calls = two_node_supervisor(tmp_path, lost_node_wait_s=0.5)
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


def test_a_worker_whose_node_lives_is_waited_for_as_before(tmp_path):
    sup, _ = two_node_supervisor(tmp_path, lost_node_wait_s=0.1)
    labeler = sup.of("labeler")[0]
    labeler.actor.hang()
    with pytest.raises(WorkerLost, match="labeler 0 died and did not come back within 0.5 s"):
        sup.wait_until_back(labeler, timeout_s=0.5)

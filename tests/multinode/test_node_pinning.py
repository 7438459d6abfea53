"""Pools pinned to nodes (pure planning, no Ray): a CPU pool's bundles, the node resource in every bundle of a
pinned pool, a node that joins late waited for (run.restart_timeout_s), and the one line when the cluster has no
node with that resource."""
import logging
import time

import pytest

from rlfarm.cluster import wait_for_pinned_nodes
from rlfarm.commands.plan import transport_lines
from rlfarm.config import compose
from rlfarm.errors import TopologyError
from rlfarm.families import LLM, OFFPOLICY
from rlfarm.topology import NODE_SHARE, check_cluster, plan_topology


def test_two_node_cpu_pins_the_train_pool_to_node_a_and_the_reward_pool_to_node_b():
    plan = plan_topology(compose("train", ["topology=two_node_cpu"]).topology, OFFPOLICY)
    assert {p.role: plan.node_of(p) for p in plan.placements} == {
        "learner": "node_a", "env_runner": "node_a", "labeler": "node_b"}
    assert plan.bundles == {"train": [{"CPU": 1.0, "node_a": NODE_SHARE}, {"CPU": 0.5, "node_a": NODE_SHARE}],
                            "reward": [{"CPU": 0.5, "node_b": NODE_SHARE}] * 2}
    assert [(p.pool, p.bundle) for p in plan.of("labeler")] == [("reward", 0), ("reward", 1)]
    llm = plan_topology(compose("train", ["topology=two_node_cpu", "experiment=grpo_digits"]).topology, LLM)
    assert {p.role: plan.node_of(p) for p in llm.placements} == {
        "learner": "node_a", "engine": "node_b", "labeler": "node_b"}


def test_a_gpu_pool_pinned_to_a_node_asks_for_it_in_every_bundle():
    topology = {"name": "t", "pools": {"reward": {"gpus": 2, "node": "node_b"}},
                "roles": {"learner": {"pool": None}, "env_runner": {"pool": None},
                          "labeler": {"pool": "reward", "count": 4, "gpus": 0.5}}}
    plan = plan_topology(topology, OFFPOLICY)
    assert plan.bundles["reward"] == [{"GPU": 1.0, "CPU": 2.0, "node_b": NODE_SHARE}] * 2


def test_a_cluster_without_the_pinned_resource_is_refused_in_one_line():
    plan = plan_topology(compose("train", ["topology=two_node_cpu"]).topology, OFFPOLICY)
    check_cluster(plan, {"CPU": 4, "node_a": 1, "node_b": 1})
    with pytest.raises(TopologyError, match="pins pool 'reward' to a node with the resource 'node_b', which no node"):
        check_cluster(plan, {"CPU": 4, "node_a": 1})


def test_a_node_that_joins_late_is_waited_for_and_one_that_never_comes_is_named(caplog):
    plan = plan_topology(compose("train", ["topology=two_node_cpu"]).topology, OFFPOLICY)
    node_a_only, both = {"CPU": 2, "node_a": 1}, {"CPU": 4, "node_a": 1, "node_b": 1}
    answers = iter([node_a_only, node_a_only, node_a_only, both])  # node B joins at the fourth look
    with caplog.at_level(logging.INFO, logger="rlfarm"):
        wait_for_pinned_nodes(plan, lambda: next(answers), wait_s=10, poll_s=0.01)
    assert next(answers, None) is None  # asked until it came, not after
    assert [r.getMessage() for r in caplog.records] == ["waiting for a node with node_b (up to 10 s) …"]

    started = time.monotonic()
    with pytest.raises(TopologyError, match="resource 'node_b', which no node of the cluster has after 0.3 s "
                                            r"\(run.restart_timeout_s\)"):
        wait_for_pinned_nodes(plan, lambda: node_a_only, wait_s=0.3, poll_s=0.05)
    assert 0.3 <= time.monotonic() - started < 2


@pytest.mark.parametrize("pool, problem", [({"gpus": 0, "node": ""}, "must name a custom resource"),
                                           ({"gpus": 0}, "asks for nothing")])
def test_bad_pinning_is_one_line(pool, problem):
    topology = {"name": "t", "pools": {"p": pool},
                "roles": {"learner": {"pool": "p", "cpus": 0}, "env_runner": {}, "labeler": {}}}
    with pytest.raises(TopologyError, match=problem):
        plan_topology(topology, OFFPOLICY)


def test_plan_names_nccl_for_an_llm_learners_weights_to_engines_on_gpus_and_the_object_store_otherwise():
    row = lambda role, node, gpus: {"role": role, "index": 0, "node": node, "node_label": f"{node} node_{node}",  # noqa: E731
                                    "gpu_ids": gpus}
    across = [row("learner", "a", ["0"]), row("engine", "b", ["0"]), row("labeler", "b", [])]
    assert transport_lines(across, "auto") == [
        "transports (roles on 2 nodes):", "  learner → engine (weights): NCCL broadcast",
        "  engine → labeler (data): shared memory (b node_b's object store)",
        "  labeler → learner (data): object store across raylets (b node_b → a node_a)",
        "  engine → learner (data): object store across raylets (b node_b → a node_a)"]
    assert transport_lines(across, "object_store")[1] == \
        "  learner → engine (weights): object store across raylets (a node_a → b node_b)"
    shared_gpu = [row("learner", "a", ["0"]), row("engine", "a", ["0"]), row("labeler", "b", [])]
    assert transport_lines(shared_gpu, "auto")[1] == "  learner → engine (weights): CUDA IPC"
    assert transport_lines([row("learner", "a", ["0"]), row("engine", "a", ["1"])], "auto") == []  # one node

"""Runs on a real two-node Ray cluster (tests/multinode/conftest.py): pools pinned to nodes, data and weights
crossing between the nodes' object stores, and the loss of a whole node."""
import json

from helpers import TINY_SAC, read_summary, rlfarm, train

TWO_NODE_SAC = ["topology=two_node_cpu", "total_env_steps=1200", *TINY_SAC, "logger=none", "run.checkpoint=false"]


def roles_by_node(run_dir) -> dict[str, set[str]]:
    """roles.json as node id → {"learner 0", "labeler 1", ...}."""
    found: dict[str, set[str]] = {}
    for row in json.loads((run_dir / "roles.json").read_text()):
        found.setdefault(row["node"], set()).add(f"{row['role']} {row['index']}")
    return found


def test_plan_shows_each_role_on_the_node_its_pool_is_pinned_to(two_nodes):
    out = rlfarm("plan", "topology=two_node_cpu", f"ray.address={two_nodes.address}", timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    node_a, node_b = two_nodes.node_id("a")[:8], two_nodes.node_id("b")[:8]
    rows = {line.split("│")[1].strip(): line for line in out.stdout.splitlines() if line.count("│") > 3}
    for role in ("learner[0]", "env_runner[0]"):
        assert f"{node_a} node_a" in rows[role], out.stdout
    for role in ("labeler[0]", "labeler[1]"):
        assert f"{node_b} node_b" in rows[role], out.stdout


def test_sac_through_two_nodes_labels_on_node_b_and_stores_every_transition(two_nodes, tmp_path):
    run_dir = tmp_path / "run"
    out = train(run_dir, *TWO_NODE_SAC, f"ray.address={two_nodes.address}", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = read_summary(run_dir)
    assert summary["transitions_produced"] == summary["transitions_labeled"] == summary["transitions_stored"] == 1200
    assert summary["updates"] > 0
    assert roles_by_node(run_dir) == {two_nodes.node_id("a"): {"learner 0", "env_runner 0"},
                                      two_nodes.node_id("b"): {"labeler 0", "labeler 1"}}

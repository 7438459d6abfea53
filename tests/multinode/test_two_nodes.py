"""Runs on a real two-node Ray cluster (tests/multinode/conftest.py): pools pinned to nodes, data and weights
crossing between the nodes' object stores, and the loss of a whole node."""
import json
import os
import signal
import time

from helpers import TINY_SAC, metrics_rows, read_summary, rlfarm, start_rlfarm, start_train, train, wait_for

TWO_NODE_SAC = ["topology=two_node_cpu", "total_env_steps=1200", *TINY_SAC, "logger=none", "run.checkpoint=false"]


def roles_by_node(run_dir) -> dict[str, set[str]]:
    """roles.json as node id → {"learner 0", "labeler 1", ...}."""
    found: dict[str, set[str]] = {}
    for row in json.loads((run_dir / "roles.json").read_text()):
        found.setdefault(row["node"], set()).add(f"{row['role']} {row['index']}")
    return found


def test_plan_shows_each_role_on_the_node_its_pool_is_pinned_to(two_nodes):
    # wide enough that no cell wraps (at 80 columns the node cell wraps below the role's line)
    out = rlfarm("plan", "topology=two_node_cpu", f"ray.address={two_nodes.address}", timeout=120, columns=200)
    assert out.returncode == 0, out.stderr[-2000:]
    node_a, node_b = two_nodes.node_id("a")[:8], two_nodes.node_id("b")[:8]
    rows = {line.split("│")[1].strip(): line for line in out.stdout.splitlines() if line.count("│") > 3}
    for role in ("learner[0]", "env_runner[0]"):
        assert f"{node_a} node_a" in rows[role], out.stdout
    for role in ("labeler[0]", "labeler[1]"):
        assert f"{node_b} node_b" in rows[role], out.stdout
    # and how weights and data cross: the labelers' chunks go between the nodes' object stores
    lines = out.stdout[out.stdout.index("transports (roles on 2 nodes):"):].splitlines()
    assert lines[1:4] == [f"  learner → env_runner (weights): shared memory ({node_a} node_a's object store)",
                          f"  env_runner → labeler (data): object store across raylets ({node_a} node_a → {node_b} node_b)",
                          f"  labeler → learner (data): object store across raylets ({node_b} node_b → {node_a} node_a)"], \
        out.stdout


def test_sac_through_two_nodes_labels_on_node_b_and_stores_every_transition(two_nodes, tmp_path):
    run_dir = tmp_path / "run"
    out = train(run_dir, *TWO_NODE_SAC, f"ray.address={two_nodes.address}", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = read_summary(run_dir)
    assert summary["transitions_produced"] == summary["transitions_labeled"] == summary["transitions_stored"] == 1200
    assert summary["updates"] > 0
    assert roles_by_node(run_dir) == {two_nodes.node_id("a"): {"learner 0", "env_runner 0"},
                                      two_nodes.node_id("b"): {"labeler 0", "labeler 1"}}


TWO_NODE_GRPO = ["experiment=grpo_digits", "topology=two_node_cpu", "topology.roles.labeler.count=1", "algo.max_updates=1",
                 "algo.prompts_per_step=4",
                 "algo.target_reward=null", "logger=none", "run.checkpoint=false"]


def test_grpo_through_two_nodes_generates_and_scores_on_node_b(two_nodes, tmp_path):
    """The LLM family across nodes: the engine and its scorer on node B, the learner on node A; the rollouts and
    the weights cross between the nodes' object stores."""
    run_dir = tmp_path / "run"
    out = train(run_dir, *TWO_NODE_GRPO, f"ray.address={two_nodes.address}", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = read_summary(run_dir)
    assert summary["updates"] == 1 and summary["samples"] == 4 * 8 and summary["weight_sync"] == "object_store"
    assert roles_by_node(run_dir) == {two_nodes.node_id("a"): {"learner 0"},
                                      two_nodes.node_id("b"): {"engine 0", "labeler 0"}}


# no periodic checkpoints: the one a resume continues from is written when the node is lost
LOST_NODE_RUN = ["topology=two_node_cpu", "total_env_steps=3000", *TINY_SAC, "logger=none", "run.checkpoint_every_min=0",
                 "run.role_timeout_s=10"]


def test_a_lost_node_ends_the_run_in_one_line_naming_it_and_resume_continues(two_nodes, tmp_path):
    """Node B (both labelers) is switched off mid-run: nothing can take its pinned roles, so the run ends within
    run.role_timeout_s with one line naming the node and its roles, the learner (on node A) checkpointed first. The
    resume is started before node B is back (a node that joins late): it waits for it, continues from the
    checkpoint written at the loss and ends with every transition labeled and stored once."""
    run_dir, node_b = tmp_path / "run", two_nodes.node_id("b")
    proc = start_train(run_dir, *LOST_NODE_RUN, f"ray.address={two_nodes.address}")
    try:
        assert wait_for(lambda: any(row.get("updates", 0) >= 100 for row in metrics_rows(run_dir)), 240), "no updates"
        two_nodes.nodes["b"].kill()
        killed = time.monotonic()
        _, err = proc.communicate(timeout=120)
        ended_s = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert proc.returncode != 0 and len(errors) == 1, err[-3000:]
    assert f"node {node_b[:8]} (" in errors[0] and "node_b" in errors[0], errors[0]
    assert "was lost with labeler 0, labeler 1" in errors[0] and f"resume={run_dir}" in errors[0], errors[0]
    # role_timeout_s, + Ray declaring the node dead (~3 s, conftest's health check) and the driver's exit: a loaded
    # 2-core machine took 22 s in all
    assert "Traceback" not in err and ended_s < 10 + 25, (ended_s, err[-2000:])
    (written,) = (run_dir / "checkpoints").glob("step_*.pt")  # at the loss: periodic ones are off

    # the resume starts before node B is back: its driver waits for a node with node_b (run.restart_timeout_s)
    resume = start_rlfarm("train", f"resume={run_dir}", "run.live=false")
    try:
        log = run_dir / "train.log"
        waiting = lambda: "waiting for a node with node_b" in log.read_text()  # noqa: E731
        assert wait_for(lambda: waiting() or resume.poll() is not None, 120) and waiting(), log.read_text()[-2000:]
        two_nodes.start_node("b", cpus=2, gpus=2)
        _, err = resume.communicate(timeout=300)
    finally:
        if resume.poll() is None:
            os.killpg(resume.pid, signal.SIGKILL)
    assert resume.returncode == 0, err[-3000:]
    assert f"resumed from {written}" in log.read_text()
    summary = read_summary(run_dir)
    assert summary["restarts"] == 1 and summary["env_steps"] == 3000
    assert summary["transitions_produced"] == summary["transitions_labeled"] == summary["transitions_stored"] == 3000
    assert roles_by_node(run_dir)[two_nodes.node_id("b")] == {"labeler 0", "labeler 1"}

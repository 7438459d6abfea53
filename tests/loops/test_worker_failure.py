"""A labeler and an env runner are SIGKILLed mid-run (by pid, as the OOM killer or a node agent would):
Ray restarts them, the loop re-wires them and re-sends what the dead labeler held, and the run finishes
with every produced transition labeled and stored exactly once."""
import json
import os
import signal
import time

import pytest

from helpers import TINY_SAC, metrics_rows, start_train, wait_for
from rlfarm.loops.vla import SERVER_DIED_BETWEEN, SERVER_DIED_IN_ROLLOUT

# Each runner has its own share of the env steps (a restarted one finishes its own), so the run cannot end before
# both kills are recovered: the shares only need to outlast the start (the kills land at ~500 steps, updates > 50).
ONE_EACH = ["total_env_steps=3000", *TINY_SAC, "algo.utd_ratio=0.25", "run.checkpoint=false"]  # topology=local
RUN = [*ONE_EACH, "topology.roles.env_runner.count=2", "topology.roles.labeler.count=2", "ray.num_cpus=4"]


# IMPALA with two data-parallel learner ranks: a restarted labeler must deliver to both ranks again, a restarted
# runner's chunks go to its rank (runner 1 → rank 1), and the ranks keep training in lockstep through it.
IMPALA = ["algo=impala", "env=cartpole", "total_env_steps=30000", "run.checkpoint=false", "logger=none",
          "topology.roles.env_runner.count=2", "topology.roles.labeler.count=2", "topology.roles.learner.count=2",
          "topology.roles.learner.threads=1", "algo.batch_chunks=1", "ray.num_cpus=5"]
# per algo: (overrides, env steps asked, the most a dead runner's unfinished chunk may take with it, updates by the kill)
CASES = {"sac": (RUN, 3000, 2 * 16, 50), "impala": (IMPALA, 30000, 32 * 8, 10)}


def learning(run_dir, updates: int = 50) -> bool:
    rows = metrics_rows(run_dir)
    return bool(rows) and rows[-1].get("updates", 0) > updates


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["sac", "impala"])
def test_killed_labeler_and_runner_restart_and_nothing_is_lost(tmp_path, algo):
    run_dir = tmp_path / "run"
    overrides, total, lost_at_most, updates = CASES[algo]
    proc = start_train(run_dir, *overrides)
    try:
        # Mid-run: learning has started and data is flowing through both labelers.
        assert wait_for(lambda: learning(run_dir, updates), 240), "the run did not start"
        roles = {(r["role"], r["index"]): r["pid"] for r in json.loads((run_dir / "roles.json").read_text())}
        killed = {"labeler": roles[("labeler", 0)], "env_runner": roles[("env_runner", 1)]}
        os.kill(killed["labeler"], signal.SIGKILL)
        os.kill(killed["env_runner"], signal.SIGKILL)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["worker_restarts"] == 2
    recovered = {(r["role"], r["pid_before"]) for r in summary["recoveries"]}
    assert recovered == {("labeler", killed["labeler"]), ("env_runner", killed["env_runner"])}
    for record in summary["recoveries"]:
        assert record["pid_after"] != record["pid_before"] and 0 < record["recovery_s"] < 120
    # Nothing lost, nothing stored twice: chunks the dead labeler held were re-sent; a chunk that had
    # already reached the learner is labeled twice (transitions_relabeled) but stored once.
    assert summary["transitions_produced"] == summary["transitions_labeled"] == summary["transitions_stored"]
    assert summary["transitions_quarantined"] == 0
    # The dead runner's unfinished chunk is the only work that may be lost (its steps are not redone).
    assert total - lost_at_most <= summary["env_steps"] <= total
    if algo == "impala":
        assert summary["learner_ranks"] == 2 and summary["updates"] > updates
    log = (run_dir / "train.log").read_text()
    assert f"labeler 0 (pid {killed['labeler']}) died; restarted as pid" in log
    assert f"env_runner 1 (pid {killed['env_runner']}) died; restarted as pid" in log
    now = {(r["role"], r["index"]): r for r in json.loads((run_dir / "roles.json").read_text())}
    assert now[("labeler", 0)]["restarts"] == 1 and now[("labeler", 0)]["pid"] != killed["labeler"]


@pytest.mark.slow
def test_a_worker_that_keeps_dying_ends_the_run_with_one_line(tmp_path):
    run_dir = tmp_path / "run"
    proc = start_train(run_dir, *ONE_EACH, "run.max_restarts=0")  # one role of each kind: the count is not tested
    try:
        assert wait_for(lambda: learning(run_dir), 240), "the run did not start"
        pid = next(r["pid"] for r in json.loads((run_dir / "roles.json").read_text()) if r["role"] == "labeler")
        os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    # Ray may add its own notice of the killed worker (one line, "(raylet) ..."); rlfarm's is the error line.
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "labeler 0 died and run.max_restarts=0 is used up" in errors[0], err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    assert not (run_dir / "summary.json").exists()


# PPO with a separate critic: the restart path is the VLA family's (GRPO's too); the critic's checkpoint is checked here
VLA = ["experiment=ppo_vla", "algo.critic=separate", "topology=local_vla_server", "algo.max_updates=8",
       "algo.target_success=null", "algo.groups_per_update=128", "algo.epochs=1", "algo.minibatches=1",
       "algo.pipeline=false", "logger=none"]


@pytest.mark.slow
def test_a_vla_worker_or_server_killed_or_hung_mid_rollout_is_restarted_and_the_groups_played_again(tmp_path):
    """The VLA family (two rollout workers and an inference server): rollout worker 1 is SIGKILLed just after an
    update's row is written, i.e. early in the next rollout. Ray restarts it, the driver re-wires it to its server and
    has it play its seeds again from the start. Later the inference server is SIGKILLed the same way: Ray restarts it,
    the driver loads the newest weights into it, and both its workers play their seeds again. Then worker 0 hangs
    (SIGSTOP: it answers nothing): after run.role_timeout_s the driver names it, has Ray restart it, and it plays its
    seeds again. Every update still gets all 128 episodes, whole."""
    pytest.importorskip("sapien", reason="SAPIEN is an optional extra: pip install -e .[sim]")
    run_dir = tmp_path / "run"
    proc = start_train(run_dir, *VLA, "run.role_timeout_s=5")

    def pid_of(role: str, index: int) -> int:
        return next(r["pid"] for r in json.loads((run_dir / "roles.json").read_text())
                    if (r["role"], r["index"]) == (role, index))

    def kill_as_a_rollout_begins(pid: int, after_s: float = 0.0, signal=signal.SIGKILL) -> None:
        rows = len(metrics_rows(run_dir))
        assert wait_for(lambda: len(metrics_rows(run_dir)) > rows, 60, every=0.005)  # a rollout has just begun
        time.sleep(after_s)
        os.kill(pid, signal)

    try:
        assert wait_for(lambda: len(metrics_rows(run_dir)) >= 2, 240), "the run did not start"
        pid, server_pid = pid_of("env_runner", 1), pid_of("engine", 0)
        kill_as_a_rollout_begins(pid)
        assert wait_for(lambda: pid_of("env_runner", 1) != pid, 120), "the worker was not recovered"
        kill_as_a_rollout_begins(server_pid, after_s=0.1)  # past the weights' load, into the rollout (~0.4 s)
        assert wait_for(lambda: pid_of("engine", 0) != server_pid, 120), "the server was not recovered"
        hung = pid_of("env_runner", 0)
        kill_as_a_rollout_begins(hung, signal=signal.SIGSTOP)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    record, server_record, hung_record = summary["recoveries"]
    assert (record["role"], record["index"], record["pid_before"]) == ("env_runner", 1, pid)
    assert record["pid_after"] != pid and record["rollout"] == "re-ran its 64 groups", record
    assert (server_record["role"], server_record["index"], server_record["pid_before"]) == ("engine", 0, server_pid)
    # (on a loaded machine the kill may still land before the rollout: the restart is then recorded as between rollouts)
    assert server_record["pid_after"] != server_pid
    assert server_record["rollouts"] in (SERVER_DIED_IN_ROLLOUT, SERVER_DIED_BETWEEN), server_record
    rows = metrics_rows(run_dir)
    assert [row["updates"] for row in rows] == list(range(1, 9)) and summary["samples"] == 8 * 128
    assert all(row["workers_on_server"] == 2 for row in rows)  # the new incarnation asks the server too
    log = (run_dir / "train.log").read_text()
    assert "env_runner 1 (pid %d) died; restarted as pid" % pid in log
    assert "engine 0 (pid %d) died; restarted as pid" % server_pid in log
    # the hung worker: named with what was wrong, restarted, its groups played again (the run still did 8 updates)
    assert (hung_record["role"], hung_record["index"], hung_record["pid_before"]) == ("env_runner", 0, hung)
    assert hung_record["pid_after"] != hung and hung_record["rollout"] == "re-ran its 64 groups", hung_record
    assert "env_runner 0 (pid %d) did not answer stats within 5 s: killing it for Ray to restart" % hung in log
    roles = {(r["role"], r["index"]): r for r in json.loads((run_dir / "roles.json").read_text())}
    assert roles[("env_runner", 1)]["restarts"] == 1 and roles[("env_runner", 1)]["pid"] == record["pid_after"]
    assert roles[("engine", 0)]["restarts"] == 1 and roles[("engine", 0)]["pid"] == server_record["pid_after"]
    assert roles[("env_runner", 0)]["restarts"] == 1 and roles[("env_runner", 0)]["pid"] == hung_record["pid_after"]
    # the separate critic trains beside the policy and is checkpointed with it; the policy has no value head
    assert rows[0]["value_mean"] == 0.0 and rows[-1]["value_loss"] >= 0 and "kept_groups" not in rows[0]
    import torch

    saved = torch.load(run_dir / "checkpoints" / "final.pt", map_location="cpu", weights_only=True)
    assert "value_head.weight" in saved["critic"] and not any("value_head" in name for name in saved["model"])

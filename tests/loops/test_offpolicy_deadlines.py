"""The off-policy driver never freezes: every wait on a role has a deadline (run.role_timeout_s). A reward model
that blocks for 10x the deadline, a learner that stalls, SIGTERM and run.max_wall_s in those states; and the
metrics rows say where the time goes (stage fractions, the bottleneck)."""
import json
import signal
import time

import pytest

from helpers import TINY_SAC, metrics_rows, read_summary, start_train, train, wait_for
from rlfarm.telemetry.stages import StageShares

DEADLINE = ["run.role_timeout_s=5"]
# Every 9th reward-model call of a labeler process blocks for 50 s (10x the deadline): the 9th is its first call
# after the warm-up calls (rlfarm/roles/labeler.py: WARMUP_CALLS), which get the longer restart deadline.
HANG = ["reward=faulty", "reward.mode=hang", "reward.fail_every=9", "reward.hang_s=50", "labeler.bus_items=16"]
ENDLESS = ["total_env_steps=1000000", *TINY_SAC, "run.checkpoint_every_updates=0", "run.checkpoint_every_min=0"]


def finish(proc, timeout):
    """Wait for the run to exit; (exit code, stderr, seconds it took from now)."""
    started = time.monotonic()
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err, time.monotonic() - started


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


def newest_row(run_dir) -> dict:
    rows = metrics_rows(run_dir)
    return rows[-1] if rows else {}


def test_a_labeler_stuck_in_one_call_ends_the_run_with_one_line_once_restarts_are_used_up(tmp_path):
    out = train(tmp_path / "run", *ENDLESS, *HANG, *DEADLINE, "run.max_restarts=0", timeout=240)
    assert out.returncode not in (0, 75), out.stderr[-2000:]
    errors = error_lines(out.stderr)
    assert len(errors) == 1, out.stderr[-2000:]
    assert "labeler 0 has been in one reward-model call for" in errors[0]
    assert "run.max_restarts=0 is used up" in errors[0]
    assert "Traceback" not in out.stderr


def test_a_labeler_whose_model_load_hangs_is_named_at_start(tmp_path):
    out = train(tmp_path / "run", *ENDLESS, "reward=faulty", "reward.setup_hang_s=600", "run.restart_timeout_s=3",
                timeout=120)
    assert out.returncode not in (0, 75), out.stderr[-2000:]
    errors = error_lines(out.stderr)
    assert len(errors) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "labeler 0 did not finish starting within run.restart_timeout_s=3 s" in errors[0]
    assert json.loads((tmp_path / "run" / "status.json").read_text())["status"] == "failed"


def test_a_labeler_stuck_in_one_call_is_restarted_and_its_chunks_resent(tmp_path):
    run_dir = tmp_path / "run"
    out = train(run_dir, "total_env_steps=400", *TINY_SAC, *HANG, *DEADLINE, "reward.heal_on_restart=true",
                "run.max_restarts=1", timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = read_summary(run_dir)
    assert summary["worker_restarts"] == 1 and summary["recoveries"][0]["role"] == "labeler"
    assert summary["transitions_produced"] == summary["transitions_labeled"] == summary["transitions_stored"] == 400
    assert summary["transitions_unlabeled"] == 0
    log = (run_dir / "train.log").read_text()
    assert "labeler 0 (pid" in log and "has been in one reward-model call for" in log and "killing it" in log

    # Where the time went: every row has the labelers' stage shares and names the bottleneck.
    # (A labeler that is dead or restarting reports nothing new: its row has no labeler shares.)
    rows = metrics_rows(run_dir)
    reported = [row for row in rows if "labeler_busy_fraction" in row]
    assert len(reported) >= len(rows) - 3
    for row in reported:
        assert row["labeler_busy_fraction"] + row["labeler_idle_fraction"] == pytest.approx(1.0)
        assert row["bottleneck"].split(" ")[0] in ("runners", "labelers", "learner")
        assert " % busy" in row["bottleneck"]
    # While the labeler hung, its model call was the longest call and kept the labelers busy.
    hung = [row for row in reported if row["reward_call_s"] >= 2]
    assert len(hung) >= 2 and all(row["labeler_busy_fraction"] > 0.5 for row in hung[1:])


def test_sigterm_while_a_labeler_hangs_writes_preempted_pt_within_30_s(tmp_path):
    run_dir = tmp_path / "run"
    # the deadline is longer than the test waits: the labeler is still in its call when the signal arrives
    proc = start_train(run_dir, *ENDLESS, *HANG, "reward.hang_s=100", "run.role_timeout_s=10")
    try:
        assert wait_for(lambda: newest_row(run_dir).get("reward_call_s", 0) >= 1, 180), "the reward model never hung"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    code, err, took = finish(proc, 60)
    assert took < 30 and code == 75, (took, code, err[-2000:])
    status = json.loads((run_dir / "status.json").read_text())
    assert status["status"] == "preempted" and (run_dir / "checkpoints" / "preempted.pt").exists()


def test_max_wall_s_ends_the_run_within_30_s_while_a_labeler_hangs(tmp_path):
    run_dir = tmp_path / "run"
    budget_s = 5  # the run's clock starts with its roles; the labeler hangs after its warm-up calls, ~1 s in
    proc = start_train(run_dir, *ENDLESS, *HANG, "reward.hang_s=300", "run.role_timeout_s=60",
                       f"run.max_wall_s={budget_s}")
    try:
        assert wait_for(lambda: metrics_rows(run_dir), 180), "no metrics row"
        first = metrics_rows(run_dir)[0]
        budget_ends = time.monotonic() - first["wall_s"] + budget_s  # the clock started wall_s before the first row
        code, err, _ = finish(proc, 120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, err[-2000:]
    assert time.monotonic() - budget_ends < 30
    summary = read_summary(run_dir)  # the summary is still written
    assert summary["transitions_unlabeled"] > 0  # what the stuck labeler held: counted, not waited for
    assert summary["transitions_produced"] > summary["transitions_labeled"] == summary["transitions_stored"]
    log = (run_dir / "train.log").read_text()
    assert f"run.max_wall_s={budget_s} reached" in log
    assert "were not labeled and stored by the end (run.max_wall_s)" in log


def test_a_stalled_learner_is_named_and_sigterm_still_ends_the_run_within_30_s(tmp_path):
    run_dir = tmp_path / "run"
    proc = start_train(run_dir, *ENDLESS, *DEADLINE, "algo.agent._target_=rlfarm.algos.stalling.StallingAgent",
                       "+algo.agent.stall_at=50", "+algo.agent.stall_s=300")
    log = run_dir / "train.log"
    try:
        named = wait_for(lambda: log.exists() and "has made no progress for" in log.read_text(), 180)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    code, err, took = finish(proc, 60)
    assert named, "the stalled learner was not named"
    assert took < 30 and code == 75, (took, code, err[-2000:])
    assert json.loads((run_dir / "status.json").read_text())["status"] == "preempted"
    # stuck inside one update burst, the learner's save snapshots from its own thread after a few seconds
    assert (run_dir / "checkpoints" / "preempted.pt").exists()


def test_stage_shares_name_the_busiest_role():
    shares = StageShares()
    runner = {"pid": 1, "stage_s": {"act": 1.0, "step": 1.0, "credit_wait": 0.0, "send": 0.0}}
    labeler = {"pid": 2, "stage_s": {"model": 0.0, "idle": 2.0}, "in_call_s": 0.0}
    shares.row({"env_runner": [runner], "labeler": [labeler], "learner": [{"pid": 3}]})  # the first look
    # one second later: the runner waited for credits 0.9 s, the labeler is 0.8 s into one model call
    runner = {"pid": 1, "stage_s": {"act": 1.05, "step": 1.05, "credit_wait": 0.9, "send": 0.0}}
    labeler = {"pid": 2, "stage_s": {"model": 0.0, "idle": 2.2}, "in_call_s": 0.8}
    row = shares.row({"env_runner": [runner], "labeler": [labeler], "learner": [{"pid": 3}]})
    assert row["runner_credit_wait_fraction"] == pytest.approx(0.9)
    assert row["runner_busy_fraction"] == pytest.approx(0.1)
    assert row["labeler_busy_fraction"] == pytest.approx(0.8) and row["labeler_idle_fraction"] == pytest.approx(0.2)
    assert "learner_busy_fraction" not in row  # reported no stage times: absent, not zero
    assert row["bottleneck"] == "labelers 80 % busy"
    # a restarted runner (new pid) counts from zero; its stepping makes it the bottleneck
    learner = {"pid": 3, "stage_s": {"update": 5.0, "store": 1.0, "idle": 4.0}}
    row = shares.row({"env_runner": [{"pid": 4, "stage_s": {"act": 0.1, "step": 0.9}}], "learner": [learner]})
    assert row["bottleneck"] == "runners 100 % busy (step 90 %)"
    assert row["learner_update_fraction"] == pytest.approx(0.5) and row["learner_busy_fraction"] == pytest.approx(0.6)
    # a learner whose stage times did not grow at all is inside one long stage (stalled): it is the bottleneck
    row = shares.row({"env_runner": [{"pid": 4, "stage_s": {"act": 0.2, "credit_wait": 0.9, "step": 0.9}}],
                      "learner": [learner]})
    assert row["bottleneck"] == "learner: inside one stage since the last row"
    # a learner that did not answer this tick (too busy): nobody else is named the bottleneck
    row = shares.row({"env_runner": [{"pid": 4, "stage_s": {"act": 0.3, "credit_wait": 2.7, "step": 1.0}}],
                      "learner": []}, late=("learner",))
    assert row["bottleneck"] == "learner: stats late (too busy to answer)"
    assert row["runner_credit_wait_fraction"] == pytest.approx(0.9)

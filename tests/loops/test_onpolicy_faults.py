"""Faults in the synchronous families, as a user meets them (a subprocess `rlfarm train`, real Ray and Hydra; the
role's pid from the run dir's roles.json): an engine (GRPO) or a runner (PPO) SIGKILLed mid-run is restarted and
the run goes on; a learner SIGSTOPped mid-run then ends the run within run.role_timeout_s + 30 s with one line
naming it and the resume command, and the GRPO run resumes from its newest checkpoint."""
import json
import os
import signal
import time

import pytest

from helpers import rlfarm, start_rlfarm

ROLE_TIMEOUT_S = 5
GRPO = ["experiment=grpo_digits", "run.live=false", "logger=none", "algo.target_reward=null",
        "algo.prompts_per_step=8", "run.max_wall_s=null", f"run.role_timeout_s={ROLE_TIMEOUT_S}"]
PPO = ["algo=ppo", "env=cartpole", "run.live=false", "logger=none", "algo.target_return=null",
       f"run.role_timeout_s={ROLE_TIMEOUT_S}", "algo.rollout_steps=32", "env.num_envs=2"]


def rows(run_dir):
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def pid_of(run_dir, role: str, index: int = 0) -> int | None:
    path = run_dir / "roles.json"
    if not path.exists():
        return None
    return next((r["pid"] for r in json.loads(path.read_text()) if (r["role"], r["index"]) == (role, index)), None)


def start(run_dir, *args):
    return start_rlfarm("train", f"hydra.run.dir={run_dir}", *args)


def wait_for(condition, timeout_s: float, proc) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def stop_learner_and_expect_one_line(run_dir, proc, after_rows: int) -> tuple[str, int]:
    """SIGSTOP the learner once the run logged `after_rows` rows; the run must end in time, naming it. Returns
    (its stderr, the learner's pid), the stopped process killed so nothing leaks."""
    wait_for(lambda: len(rows(run_dir)) >= after_rows and pid_of(run_dir, "learner"), 300, proc)
    learner = pid_of(run_dir, "learner")
    os.kill(learner, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        proc.wait(timeout=ROLE_TIMEOUT_S + 30)
        ended_s = time.monotonic() - stopped
    finally:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(learner, sig)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert proc.returncode not in (0, None) and ended_s < ROLE_TIMEOUT_S + 30, err[-3000:]
    line = f"learner (pid {learner}) did not answer stats within {ROLE_TIMEOUT_S} s"
    assert line in err and f"rlfarm train resume={run_dir}" in err, err[-3000:]
    return err, learner


def kill_and_see_it_restarted(run_dir, proc, role: str) -> tuple[int, int]:
    """SIGKILL `role` 1 once the run logged 3 rows; wait for Ray's restart and two more rows from the new process.
    Returns (the killed pid, the rows logged then); the run is killed if any of it fails."""
    try:
        wait_for(lambda: len(rows(run_dir)) >= 3 and pid_of(run_dir, role, 1), 300, proc)
        killed = pid_of(run_dir, role, 1)
        os.kill(killed, signal.SIGKILL)
        wait_for(lambda: pid_of(run_dir, role, 1) not in (None, killed), 300, proc)
        restarted_at = len(rows(run_dir))
        wait_for(lambda: len(rows(run_dir)) >= restarted_at + 2, 300, proc)  # the run goes on with the new one
    except BaseException:
        proc.kill()
        raise
    return killed, restarted_at + 2


@pytest.mark.slow
def test_a_killed_grpo_engine_is_restarted_then_a_stopped_learner_ends_the_run_in_one_line_and_it_resumes(tmp_path):
    """One GRPO run (two engines, one step ahead) for both faults, as the PPO test below: engine 1 SIGKILLed is
    restarted and the steps go on, every update once; then the learner SIGSTOPped ends the run in one line, and the
    command it gives resumes the run from its newest checkpoint."""
    run_dir = tmp_path / "run"
    args = [*GRPO, "algo.max_updates=200", "topology.roles.engine.count=2", "algo.max_staleness=1", "ray.num_cpus=4",
            "run.checkpoint_every_updates=2"]
    proc = start(run_dir, *args)
    engine, went_on_at = kill_and_see_it_restarted(run_dir, proc, "engine")
    stop_learner_and_expect_one_line(run_dir, proc, after_rows=went_on_at)
    assert f"engine 1 (pid {engine}) died; restarted as pid" in (run_dir / "train.log").read_text()
    assert list((run_dir / "checkpoints").glob("step_*.pt")), "no periodic checkpoint to resume from"
    # the command the line gave, as the user would type it, with another budget: `algo.max_updates` is checked
    # against the resumed run's config (GRPO's), not the default composition's (SAC has no such key)
    stopped_at = len(rows(run_dir))
    out = rlfarm("train", f"resume={run_dir}", f"algo.max_updates={stopped_at + 2}", timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ignored" not in out.stdout + out.stderr  # the run's own overrides compose what it saved: nothing differs
    assert "resumed from" in (run_dir / "train.log").read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    logged = rows(run_dir)
    assert summary["updates"] == stopped_at + 2 and [r["updates"] for r in logged] == list(range(1, stopped_at + 3))
    assert all(r["staleness"] <= 1 for r in logged)


@pytest.mark.slow
def test_a_killed_ppo_runner_is_restarted_then_a_stopped_learner_ends_the_run_in_one_line(tmp_path):
    """One PPO run for both faults: runner 1 SIGKILLed is restarted and the cycles go on, every update once; then
    the learner SIGSTOPped ends the run in one line."""
    run_dir = tmp_path / "run"
    proc = start(run_dir, *PPO, "total_env_steps=1000000", "topology.roles.env_runner.count=2", "ray.num_cpus=4",
                 "run.checkpoint_every_updates=2")
    runner, went_on_at = kill_and_see_it_restarted(run_dir, proc, "env_runner")
    stop_learner_and_expect_one_line(run_dir, proc, after_rows=went_on_at)
    assert f"env_runner 1 (pid {runner}) died; restarted as pid" in (run_dir / "train.log").read_text()
    updates = [r["updates"] for r in rows(run_dir)]
    assert updates == list(range(1, len(updates) + 1))  # every cycle trained once, none twice

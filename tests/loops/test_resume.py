"""Exact resume after a hard kill, and SIGTERM preemption → checkpoint → resume=auto."""
import os
import signal

import pytest

from helpers import TINY_SAC, metrics_rows, read_summary, rlfarm, start_train, wait_for

# two periodic checkpoints by ~550 env steps (learning starts at 200, one update per step); the resumed run goes on
# from the older one to the end
TINY = ["total_env_steps=1500", *TINY_SAC, "run.checkpoint_every_updates=150"]


def start(run_dir, *overrides):
    return start_train(run_dir, *TINY, *overrides)


@pytest.mark.slow
def test_sigkill_then_resume_continues_from_the_newest_intact_checkpoint(tmp_path):
    """A node dies (SIGKILL to the whole process group) after two periodic checkpoints, and the newest file was
    damaged on the way (a disk, a partial copy): resume skips it, says so, continues from the previous one."""
    run_dir = tmp_path / "run"
    proc = start(run_dir)
    assert wait_for(lambda: len(list((run_dir / "checkpoints").glob("step_*.pt.sha256"))) >= 2, 240), \
        "no two periodic checkpoints"
    os.killpg(proc.pid, signal.SIGKILL)  # the whole process group, as a node failure would
    proc.wait(timeout=30)
    assert not (run_dir / "summary.json").exists()
    import torch
    newest, previous = sorted((run_dir / "checkpoints").glob("step_*.pt"), key=os.path.getmtime, reverse=True)[:2]
    state = torch.load(previous, weights_only=True)
    mtime = os.path.getmtime(newest)
    os.truncate(newest, os.path.getsize(newest) // 2)
    os.utime(newest, (mtime, mtime))  # still the newest by time: only its contents are damaged

    out = rlfarm("train", f"resume={run_dir}", "run.live=false", "algo.batch_size=64")
    assert out.returncode == 0, out.stderr[-2000:]
    said = out.stdout + out.stderr
    # the checkpoint was trained at another batch size: the override is not applied, and the user is told
    assert "resume keeps the run's saved config: ignored algo.batch_size=64" in said
    assert (f"checkpoints/{newest.name} is damaged (truncated: sha256 mismatch): skipped, "
            f"resuming from checkpoints/{previous.name}") in said
    assert f"resumed from {previous} at {state['stored']} env steps" in said
    summary = read_summary(run_dir)
    assert summary["env_steps"] == 1500 and summary["restarts"] == 1
    assert summary["updates"] >= state["updates"]  # counters continue, they do not restart at zero
    assert summary["transitions_stored"] == summary["transitions_produced"] == 1500
    rows = metrics_rows(run_dir)
    steps, walls = [row["env_steps"] for row in rows], [row["wall_s"] for row in rows]
    # No step is logged twice: rows written after the checkpoint by the killed run were dropped, and the
    # resumed run's rows continue above the checkpoint (rows repeat an env_steps value only while acting
    # waits on learning, with increasing wall time).
    assert steps == sorted(steps) and walls == sorted(walls), "metrics.jsonl goes back in time"
    assert len({(r["env_steps"], r["updates"]) for r in rows}) == len(rows), "metrics.jsonl repeats a row"
    resumed_rows = [row for row in rows if row["env_steps"] > state["stored"]]
    assert resumed_rows and resumed_rows[0]["updates"] >= state["updates"]


# SIGTERM → preempted.pt → exit 75 → resume=auto on this loop: tests/loops/test_actor_learner_cartpole.py (APPO,
# learning across the two sessions) and tests/slurm/test_slurm.py (USR1 before the time limit; a requeued sweep job
# whose rerun labels slowly, so its tail is still in flight when the runners finish).

"""`rlfarm train resume=<run_dir> <overrides>`: the overrides are checked against the resumed run's config (its
own algo, experiment and values, rlfarm/commands/resume.py), not the default composition: a GRPO run resumed with
`algo.max_updates=...` (a key SAC, the default algorithm, does not have) continues to the new budget."""
import json
import signal

import pytest
import torch

from helpers import metrics_rows, read_summary, rlfarm, start_train, wait_for

SHRUNK = ["experiment=grpo_digits", "algo.prompts_per_step=8", "algo.target_reward=null", "logger=none",
          "algo.max_updates=1000", "run.checkpoint_every_updates=2"]


@pytest.mark.slow
def test_a_grpo_run_resumed_with_a_new_budget_continues_to_it(tmp_path):
    run_dir = tmp_path / "run"
    proc = start_train(run_dir, *SHRUNK)
    assert wait_for(lambda: len(metrics_rows(run_dir)) >= 3 or proc.poll() is not None, 300), "no third update"
    proc.send_signal(signal.SIGTERM)  # as Slurm preempts: a checkpoint at the update reached, exit 75
    proc.wait(timeout=120)
    assert proc.returncode == 75, proc.stderr.read()[-2000:]
    assert json.loads((run_dir / "status.json").read_text())["status"] == "preempted"
    stopped_at = torch.load(run_dir / "checkpoints" / "preempted.pt", weights_only=True)["extra"]["updates"]

    # only the run directory and the new budget are typed: the run's own choices come from the run
    out = rlfarm("train", f"resume={run_dir}", "run.live=false", f"algo.max_updates={stopped_at + 2}")
    assert out.returncode == 0, out.stderr[-3000:]
    said = out.stdout + out.stderr
    assert "ignored" not in said, said[-2000:]  # the run's own overrides compose what it saved: nothing differs
    summary = read_summary(run_dir)
    assert summary["updates"] == stopped_at + 2  # the saved budget (1000) was replaced, not kept
    assert [row["updates"] for row in metrics_rows(run_dir)] == list(range(1, stopped_at + 3))


def test_an_override_the_resumed_run_does_not_have_is_refused_by_its_config(tmp_path):
    """The check runs against the run's config: a key GRPO does not read is one line naming it (GRPO's closest)."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("algo:\n  name: grpo\n")  # the directory of a run (what is_run_dir asks)
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "overrides.yaml").write_text("- experiment=grpo_digits\n- algo.prompts_per_step=8\n")
    out = rlfarm("train", f"resume={run_dir}", "algo.max_update=80", timeout=120)
    assert out.returncode == 2 and "unknown config key 'algo.max_update'" in out.stderr, out.stderr[-2000:]
    assert "did you mean algo.max_updates?" in out.stderr
    ok = rlfarm("train", f"resume={run_dir}", "algo.max_updates=80", "--cfg", "job", timeout=120)
    assert ok.returncode == 0 and "max_updates: 80" in ok.stdout and "prompts_per_step: 8" in ok.stdout, ok.stderr

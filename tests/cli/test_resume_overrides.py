"""`rlfarm train resume=<run_dir> <overrides>`: the overrides are checked against the resumed run's config (its
own algo, experiment and values, rlfarm/commands/resume.py), not the default composition: a GRPO run resumed with
`algo.max_updates=...` (a key SAC, the default algorithm, does not have) continues to the new budget (run by
tests/loops/test_onpolicy_faults.py, after a stopped learner); a key the resumed run lacks is refused in one line."""
from helpers import rlfarm


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

"""`rlfarm train experiment=ppo_lm_digits`: token-level PPO with a critic, through the same Ray roles as GRPO
(engine → scorer → learner with its critic → sync), learns to copy 4 digits from scratch on CPU."""
import pytest

from helpers import metrics_rows, read_summary
from helpers import train as rlfarm_train


def train(run_dir, *overrides, timeout=900):
    return rlfarm_train(run_dir, "experiment=ppo_lm_digits", *overrides, timeout=timeout)


@pytest.mark.slow
def test_ppo_lm_digits_reaches_095_within_5_minutes(tmp_path):
    run_dir = tmp_path / "run"
    out = train(run_dir)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = read_summary(run_dir)
    assert summary["reward_mean"] >= 0.95 and summary["reached_target"], summary
    assert summary["wall_s"] <= 300
    rows = metrics_rows(run_dir)
    assert rows[0]["reward"] < 0.3  # it started near chance
    assert rows[-1]["value_loss"] < rows[0]["value_loss"] or rows[-1]["value_rmse"] < 0.1  # the critic learned
    # the learner holds a critic: the metrics show it, the checkpoint saves it
    assert all("value_loss" in row and "value_rmse" in row for row in rows)
    assert summary["samples"] == summary["updates"] * 256
    import torch
    assert "critic" in torch.load(run_dir / "checkpoints" / "final.pt", weights_only=True)


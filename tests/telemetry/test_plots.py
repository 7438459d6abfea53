"""Figures and the markdown table from synthetic run directories (the files `rlfarm train` writes)."""
import json

import matplotlib.image as mpimg
import numpy as np
import pytest
import yaml

from rlfarm.telemetry.plots import (PANEL_INCHES, load_runs, mean_spread, moving_average, plot_panels, seed_groups,
                                    series, write_report)


def fake_run(directory, seed, lr=0.001, steps=10, finished=True, offset=0.0):
    directory.mkdir(parents=True)
    config = {"algo": {"name": "sac", "lr": lr}, "env": {"id": "Pendulum-v1", "kwargs": {}}, "seed": seed,
              "model": {"actor": {"hidden": [32, 32]}}}
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    rows = [{"env_steps": 100 * i, "wall_s": 1.0 * i + offset, "env_steps_per_s": 100.0, "labeled_per_s": 90.0 + i,
             "updates_per_s": 50.0, "labeling_lag_s": None if i == 0 else 0.1, "buffer_size": 100 * i,
             "episode_return_mean": None if i < 2 else -1000.0 + 50 * i + seed} for i in range(steps)]
    (directory / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n{\"env_steps\": 9")  # torn last line
    if finished:
        summary = {"env_steps": 100 * (steps - 1), "updates": 500, "episode_return_mean": rows[-1]["episode_return_mean"],
                   "wall_s": rows[-1]["wall_s"], "transitions_stored": 100 * (steps - 1)}
        (directory / "summary.json").write_text(json.dumps(summary))
    return directory


@pytest.fixture
def sweep(tmp_path):
    root = tmp_path / "sweep"
    fake_run(root / "0", seed=1)
    fake_run(root / "1", seed=2, offset=0.5)
    fake_run(root / "2", seed=1, lr=0.01)
    fake_run(root / "10", seed=2, lr=0.01, finished=False)
    (root / "10" / "status.json").write_text(json.dumps({"status": "failed", "error": "boom"}))
    return root


def test_runs_are_labelled_by_what_differs_and_grouped_by_seed(sweep):
    runs = load_runs(sweep)
    assert [r.dir.name for r in runs] == ["0", "1", "2", "10"]  # natural order
    assert [r.label for r in runs] == ["seed=1 algo.lr=0.001", "seed=2 algo.lr=0.001", "seed=1 algo.lr=0.01",
                                       "seed=2 algo.lr=0.01"]
    assert [[r.dir.name for r in g] for g in seed_groups(runs)] == [["0", "1"], ["2", "10"]]
    assert runs[3].state == "failed: boom" and runs[3].final["env_steps"] == 900  # last metrics row stands in
    x, y = series(runs[0], "episode_return_mean", "env_steps")
    assert x.tolist() == [100.0 * k for k in range(2, 10)] and len(y) == 8  # None rows dropped


def test_moving_average_and_mean_spread():
    assert moving_average(np.array([1.0, 3.0, 5.0, 7.0]), 2).tolist() == [1.0, 2.0, 4.0, 6.0]
    grid, mean, std = mean_spread([(np.array([0.0, 10.0]), np.array([0.0, 10.0])),
                                   (np.array([2.0, 12.0]), np.array([2.0, 2.0]))], points=5)
    assert grid[0] == 2.0 and grid[-1] == 10.0  # the range both curves cover
    assert mean[0] == pytest.approx(2.0) and std[0] == pytest.approx(0.0) and mean[-1] == pytest.approx(6.0)
    assert mean_spread([(np.array([0.0, 1.0]), np.array([0.0, 1.0]))]) is None


def test_write_report_figures_and_markdown(sweep):
    result = write_report(sweep, smooth=3, dpi=50)
    names = {p.name for p in result["figures"]}
    assert names == {"returns.png", "throughput.png", "labeling.png", "overview.png", "returns_across_seeds.png"}
    image = mpimg.imread(sweep / "report" / "throughput.png")
    assert image.shape[:2] == (round((PANEL_INCHES[1] + 0.4) * 50), round(PANEL_INCHES[0] * 3 * 50))
    assert image.std() > 0.01  # something is drawn
    markdown = result["markdown"].read_text()
    table = [line for line in markdown.splitlines() if line.startswith("| seed=")]
    assert len(table) == 4 and "| failed: boom |" in table[3] and "| -549.0 |" in table[0]
    assert "| algo.lr=0.001 (2 seeds) | 1, 2 | -548.5 ± 0.5 |" in markdown


def test_runs_that_log_the_labeled_reward_get_a_rewards_figure(tmp_path):
    """A learned reward is judged by the true return beside the reward trained on: rewards.png, 3 panels."""
    run = fake_run(tmp_path / "run", seed=1)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.endswith("}")]
    rows = [{**r, "labeled_reward_mean": 1.0 + r["env_steps"] / 1000, "env_reward_mean": -1.0} for r in rows]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    result = write_report(run, dpi=30)
    assert "rewards.png" in {p.name for p in result["figures"]}
    image = mpimg.imread(run / "report" / "rewards.png")
    assert image.shape[1] == round(PANEL_INCHES[0] * 3 * 30) and image.std() > 0.01


def test_legends_name_only_the_keys_that_tell_runs_apart(tmp_path):
    import yaml

    for name, reward in (("env", {"_target_": "rlfarm.rewards.env.EnvReward"}),
                         ("a", {"_target_": "rlfarm.rewards.model.ModuleReward", "model": "/tmp/fit/a/reward_model.pt", "dtype": "bf16"}),
                         ("b", {"_target_": "rlfarm.rewards.model.ModuleReward", "model": "/tmp/fit/b/reward_model.pt", "dtype": "bf16"})):
        fake_run(tmp_path / name, seed=1)
        config = yaml.safe_load((tmp_path / name / "config.yaml").read_text())
        (tmp_path / name / "config.yaml").write_text(yaml.safe_dump({**config, "reward": reward}))
    assert [r.label for r in load_runs(tmp_path)] == [
        "reward._target_=ModuleReward reward.model=/tmp/fit/a/reward_model.pt",
        "reward._target_=ModuleReward reward.model=/tmp/fit/b/reward_model.pt",
        "reward._target_=EnvReward reward.model=None"]


def test_single_run_has_no_seed_figure(tmp_path):
    run = fake_run(tmp_path / "run", seed=3)
    result = write_report(run, dpi=30)
    assert result["runs"] == 1 and not (run / "report" / "returns_across_seeds.png").exists()
    assert (run / "report.md").read_text().count("| done |") == 1


def test_a_panel_without_data_still_renders(tmp_path):
    run = fake_run(tmp_path / "run", seed=1, steps=1)
    path = plot_panels(load_runs(run), ["return_vs_steps"], tmp_path / "empty.png", dpi=30)
    assert mpimg.imread(path).shape[:2] == (round((PANEL_INCHES[1] + 0.4) * 30), round(PANEL_INCHES[0] * 30))


def test_a_family_draws_its_own_panels_and_none_without_data(tmp_path):
    """A GRPO run: its reward, response length, KL and stage times, by update; no return or buffer panel (it logs
    neither), no "no data"; report.md's columns are the family's."""
    run = tmp_path / "grpo"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"algo": {"name": "grpo", "family": "llm"}, "seed": 1}))
    rows = [{"updates": i, "wall_s": 0.5 * i, "samples": 64 * i, "reward": 0.1 * i, "reward_mean": 0.05 * i,
             "response_len": 5.0, "approx_kl": 0.01, "entropy": 2.0, "staleness": 0, "generate_s": 0.2,
             "update_s": 0.1} for i in range(1, 6)]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (run / "summary.json").write_text(json.dumps({"updates": 5, "reward_mean": 0.25, "samples": 320, "wall_s": 2.5,
                                                  "policy_staleness_max": 0}))
    result = write_report(run, dpi=20)
    assert result["panels"]["rewards"] == ["reward", "response_len"]
    assert result["panels"]["policy"] == ["kl", "update_entropy"]
    assert result["panels"]["pipeline"] == ["stage_times", "staleness"]
    assert "returns" not in result["panels"] and "throughput" not in result["panels"]
    header = next(line for line in result["markdown"].read_text().splitlines() if line.startswith("| run"))
    assert header == ("| run | dir | status | updates | samples | reward (last 10) | response length | staleness max "
                      "| wall s |")

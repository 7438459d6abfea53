"""`rlfarm eval` as a user runs it: a subprocess over a real (tiny) trained run; read what it wrote."""
import json

import imageio.v2 as imageio
import pytest

from helpers import one_line_error, rlfarm


def returns_of(run_dir):
    return json.loads((run_dir / "eval" / "returns.json").read_text())


@pytest.mark.slow
def test_eval_writes_returns_and_decodable_videos(tiny_sweep, tmp_path):
    run_dir = tiny_sweep / "0"
    out = rlfarm("eval", f"run_dir={run_dir}", "episodes=3", "video_episodes=2", "video_size=64", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    result = returns_of(run_dir)
    assert result["checkpoint"] == "checkpoints/final.pt" and result["checkpoint_updates"] == 201
    assert [e["seed"] for e in result["episodes"]] == [1000, 1001, 1002]
    assert all(e["length"] == 50 for e in result["episodes"])  # max_episode_steps=50 from the run's env.kwargs
    returns = [e["return"] for e in result["episodes"]]
    assert result["return_mean"] == pytest.approx(sum(returns) / 3) and result["return_std"] >= 0
    assert result["videos"] == ["eval/episode_000.mp4", "eval/episode_001.mp4"]
    reader = imageio.get_reader(run_dir / result["videos"][0])
    frames = [frame for frame in reader]
    reader.close()
    assert len(frames) == 50 and frames[0].shape == (64, 64, 3)  # one frame per step
    assert "episode" in out.stdout and "mean" in out.stdout  # the table
    assert list(tmp_path.iterdir()) == []  # nothing stray (outputs/, .hydra) where the command ran
    assert not (run_dir / "eval" / ".hydra").exists()

    # Episode i depends only on seed + i: the same returns without video, and with fewer episodes.
    out = rlfarm("eval", f"run_dir={run_dir}", "episodes=2", "video=false", "checkpoint=final", "reward_model=true")
    assert out.returncode == 0, out.stderr[-2000:]
    again = returns_of(run_dir)
    assert [e["return"] for e in again["episodes"]] == returns[:2]
    assert again["videos"] == [] and not list((run_dir / "eval").glob("*.mp4"))  # stale videos removed
    # reward=env: the run's reward model sums the env reward, so both returns agree.
    for e in again["episodes"]:
        assert e["reward_model_return"] == pytest.approx(e["return"], rel=1e-5)
    assert again["reward_model"] == "rlfarm.rewards.env.EnvReward"


@pytest.mark.slow
def test_eval_unknown_checkpoint_lists_the_ones_there(tiny_sweep):
    line = one_line_error(rlfarm("eval", f"run_dir={tiny_sweep / '1'}", "checkpoint=nope.pt"))
    assert "checkpoint 'nope.pt' not found" in line and "final.pt" in line


@pytest.mark.parametrize("case, needle", [
    ("missing", "does not exist"),
    ("empty", "is not a run directory"),
    ("sweep", "it holds 1 run: pass one, e.g. run_dir="),
    ("sweep/0", "no checkpoint in"),
])
def test_bad_run_dir_is_one_line_and_writes_nothing(tmp_path, case, needle):
    (tmp_path / "empty").mkdir()
    (tmp_path / "sweep" / "0").mkdir(parents=True)
    (tmp_path / "sweep" / "0" / "config.yaml").write_text("seed: 1\n")  # a run that never got to its checkpoint
    line = one_line_error(rlfarm("eval", f"run_dir={tmp_path / case}", cwd=tmp_path))
    assert needle in line
    assert not list(tmp_path.rglob("eval")) and sorted(p.name for p in tmp_path.iterdir()) == ["empty", "sweep"]


def test_an_llm_run_is_refused_in_one_line_saying_where_its_scores_are(tmp_path):
    run_dir = tmp_path / "grpo"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("algo:\n  name: grpo\n  family: llm\n")
    (run_dir / "checkpoints" / "final.pt").write_bytes(b"")
    line = one_line_error(rlfarm("eval", f"run_dir={run_dir}", cwd=tmp_path))
    assert f"{run_dir} is a grpo run (llm family), which it does not play" in line
    assert "reward_mean" in line and f"rlfarm report path=<run dir>" in line
    assert not (run_dir / "eval").exists()


@pytest.mark.parametrize("args, needle", [
    ([], "run_dir is required"),
    (["run_dir=.", "episodes=0"], "episodes must be an integer >= 1"),
    (["run_dir=.", "video_size=65"], "video_size must be even"),
    (["/some/run"], "'/some/run' is not an override"),
    (["run_dir=.", "reward=true"], "reward_model=true"),
])
def test_bad_options_are_one_line(tmp_path, args, needle):
    assert needle in one_line_error(rlfarm("eval", *args, cwd=tmp_path))

"""Configs, an env and a reward from outside the repo (issue 34): the README's "Bring your own" example run as
written (one short train, one eval, as a user runs them: the `rlfarm` command in the example's folder, which is
not on PYTHONPATH), and the other spellings checked where they are decided, before Hydra runs."""
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import ENV
from rlfarm import cli
from rlfarm.config import search

README = Path(__file__).resolve().parents[2] / "README.md"
RLFARM = Path(sys.executable).parent / "rlfarm"  # the console script: unlike `python -m`, it adds no folder to sys.path


def readme_example() -> tuple[dict[str, str], list[str]]:
    """The section's files ({path: text}, each block after a line naming it in backquotes) and its commands."""
    section = README.read_text().split("## Bring your own", 1)[1].split("\n## ", 1)[0]
    files = {path: body for path, body in re.findall(r"^`([\w/.]+)`:.*?\n```(?:python|yaml)\n(.*?)```", section,
                                                       re.S | re.M)}
    commands = re.search(r"```bash\n(.*?)```", section, re.S).group(1).strip().splitlines()
    return files, commands


@pytest.fixture(autouse=True)
def builtin_search_path():
    """cli.main sets the process's config search path (rlfarm.config.search): later tests compose conf/ alone."""
    yield
    search.use(None)


@pytest.fixture
def project(tmp_path) -> Path:
    files, commands = readme_example()
    assert commands[0] == "cd my_project" and {"reach1d.py", "bar_reward.py"} <= set(files), (files.keys(), commands)
    folder = tmp_path / "my_project"
    for path, text in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
    return folder


def run_as_written(command: str, cwd: Path) -> subprocess.CompletedProcess:
    args = shlex.split(command)
    assert args[0] == "rlfarm"
    program = [str(RLFARM)] if RLFARM.exists() else [sys.executable, "-c", "from rlfarm.cli import main; main()"]
    env = {key: value for key, value in ENV.items() if key != "RLFARM_ENV_IMPORTS"}
    return subprocess.run([*program, *args[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_readme_example_trains_and_evaluates_as_written(project):
    """--config-dir finds the experiment; env.id=reach1d:Reach1D-v0 and reward.module._target_=bar_reward.BarReward
    are imported from the folder the command runs in, by the driver, the Ray workers and `rlfarm eval`."""
    _, commands = readme_example()
    train, evaluate = commands[1], commands[2]
    out = run_as_written(train, project)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = project / "runs" / "my_reach"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["transitions_labeled"] == summary["transitions_produced"] == 1000 and summary["updates"] > 0
    config = (run_dir / "config.yaml").read_text()
    assert "reach1d:Reach1D-v0" in config and "bar_reward.BarReward" in config
    out = run_as_written(evaluate, project)
    assert out.returncode == 0, out.stderr[-3000:]
    returns = json.loads((run_dir / "eval" / "returns.json").read_text())
    assert returns["env_id"] == "reach1d:Reach1D-v0" and len(returns["episodes"]) == 3


def preflight(args: list[str], monkeypatch) -> list[str]:
    """`rlfarm train <args>` up to where Hydra would start the run: the arguments Hydra gets."""
    started = []
    monkeypatch.setattr(cli, "run_hydra_app", lambda task, name, command, rest: started.append(rest))
    cli.main(["train", *args])
    return started[0]


@pytest.mark.parametrize("spelling", [["--config-dir", "my_configs"], ["--config-dir=my_configs"], ["-cd", "my_configs"],
                                      ["hydra.searchpath=[file://my_configs]"]])
def test_every_spelling_of_a_config_folder_reaches_the_checks_and_hydra(project, monkeypatch, spelling):
    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.setenv("RLFARM_ENV_IMPORTS", "")  # recorded, so the import the test makes is undone after it
    given = preflight([*spelling, "experiment=my_reach", "hydra.run.dir=runs/x"], monkeypatch)
    assert given[:len(spelling)] == spelling  # Hydra reads the folder itself
    assert not (project / "runs").exists()


def test_plan_and_eval_take_a_config_folder(project, monkeypatch, capsys):
    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.setenv("RLFARM_ENV_IMPORTS", "")  # recorded, so the import the test makes is undone after it
    started = []
    monkeypatch.setattr(cli, "run_hydra_app", lambda task, name, command, rest: started.append(command))
    cli.main(["plan", "--config-dir", "my_configs", "experiment=my_reach", "hydra.run.dir=runs/x"])
    assert started == ["plan"]
    with pytest.raises(SystemExit):  # the folder is not taken for an override: the run dir is what is missing
        cli.main(["eval", "--config-dir", "my_configs", "run_dir=runs/none"])
    assert "run_dir 'runs/none' does not exist" in capsys.readouterr().err


def test_a_misspelled_option_of_ones_own_gets_did_you_mean(project, monkeypatch, capsys):
    monkeypatch.chdir(project)
    with pytest.raises(SystemExit) as exited:
        cli.main(["train", "--config-dir=my_configs", "experiment=my_rech", "hydra.run.dir=runs/x"])
    assert exited.value.code == 2
    assert "did you mean experiment=my_reach?" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["train", "--config-dir", "no_such_folder", "experiment=my_reach"])
    assert "--config-dir=no_such_folder: no such folder" in capsys.readouterr().err


def test_env_imports_reach_a_fresh_process(project, monkeypatch):
    """env.imports=[reach1d] with a plain id: the driver imports it and names it in RLFARM_ENV_IMPORTS, which a process
    started from it (a Ray worker, an env worker) reads before it looks the id up."""
    from rlfarm.config import check_env_id

    monkeypatch.syspath_prepend(str(project))
    monkeypatch.setenv("RLFARM_ENV_IMPORTS", "")  # recorded, so the import the test makes is undone after it
    check_env_id("Reach1D-v0", None, ["reach1d"])
    assert os.environ["RLFARM_ENV_IMPORTS"] == "reach1d"
    child = subprocess.run([sys.executable, "-c", "from rlfarm.envs.registry import registered_spec; "
                            "print(registered_spec('Reach1D-v0').id)"], cwd=project, capture_output=True, text=True,
                           env={**ENV, "RLFARM_ENV_IMPORTS": os.environ["RLFARM_ENV_IMPORTS"]}, timeout=120)
    assert child.stdout.strip() == "Reach1D-v0", child.stderr[-2000:]


def test_a_torchscript_reward_through_reward_model(project, monkeypatch):
    """reward.model=<TorchScript file>: passes the checks (built and probed in the driver), labels like its module."""
    from rlfarm.rewards import ModuleReward

    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.setenv("RLFARM_ENV_IMPORTS", "")  # recorded, so the import the test makes is undone after it
    import bar_reward

    torch.jit.save(torch.jit.script(bar_reward.BarReward()), "bar_reward.ts")
    preflight(["--config-dir=my_configs", "experiment=my_reach", "reward.module._target_=null",
               "reward.model=bar_reward.ts", "hydra.run.dir=runs/x"], monkeypatch)
    reward = ModuleReward(model="bar_reward.ts", frame_size=32)
    reward.setup("cpu")
    frames = np.zeros((2, 32, 32, 3), np.uint8)
    frames[0, :, 15, 0] = frames[1, :, 0, 0] = 255  # a bar in the middle, one at the edge
    np.testing.assert_allclose(reward({"frames": frames}), [-1 / 31, -1.0], atol=1e-6)


class NoFrames(__import__("gymnasium").Env):
    """An env that does not render (no render_modes)."""
    import gymnasium as _gym

    observation_space = _gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = _gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


def test_a_frame_reward_on_an_env_that_does_not_render_is_one_line(tmp_path, monkeypatch, capsys):
    import gymnasium as gym
    from test_bad_input import assert_one_clear_line

    if "NoFrames-v0" not in gym.registry:
        gym.register(id="NoFrames-v0", entry_point=NoFrames, max_episode_steps=10)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "run_hydra_app", lambda *_: pytest.fail("the preflight let this through"))
    with pytest.raises(SystemExit) as exited:
        cli.main(["train", "env.id=NoFrames-v0", "reward=model", f"hydra.run.dir={tmp_path}/run",
                  "reward.module._target_=rlfarm.rewards.model.BrightnessReward"])
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert_one_clear_line(captured.out, captured.err, "reads frames, but NoFrames-v0 does not render them")
    assert list(tmp_path.iterdir()) == []

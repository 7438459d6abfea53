"""Shared by the tests that run `rlfarm` as a user does (a subprocess) and read the run directory it wrote."""
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import driver_server
from ray_nodes import RayNodes

ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}

# A SAC run small enough for a smoke test: tiny networks and batches, learning starts early.
TINY_SAC = ["algo.learning_starts=200", "algo.batch_size=32", "algo.chunk_steps=16",
            "model.actor.hidden=[32,32]", "model.critic.hidden=[32,32]"]

# `make run`'s config with 64-unit networks (a sixteenth of the learner's matmul work: CI's CPU is learner-bound),
# half its env steps and learning from 1,000 stored transitions instead of 5,000 (CleanRL's default; make run keeps it).
PENDULUM_SAC_64 = ["model.actor.hidden=[64,64]", "model.critic.hidden=[64,64]", "total_env_steps=10000",
                   "algo.learning_starts=1000"]


# The tests' `rlfarm` is a fork of a warm server (tests/driver_server.py: ~4.5 CPU-s of imports saved per command);
# RLFARM_TEST_SUBPROCESS=1 starts each as a fresh `python -m rlfarm.cli` instead.
FRESH_PROCESSES = os.environ.get("RLFARM_TEST_SUBPROCESS") == "1"


def rlfarm(*args, cwd=None, timeout=600, columns=None):
    """`rlfarm <args>` in a process of its own, its output captured (subprocess.run's CompletedProcess);
    columns: the terminal width its tables are drawn for (80 without a tty)."""
    env = ENV if columns is None else {**ENV, "COLUMNS": str(columns)}
    if FRESH_PROCESSES:
        return subprocess.run([sys.executable, "-m", "rlfarm.cli", *args], capture_output=True, text=True,
                              timeout=timeout, cwd=cwd, env=env)
    return driver_server.run([str(a) for a in args], cwd=cwd, env=env, timeout=timeout)


# One real Ray cluster per test process (each xdist worker), started on first use and stopped when the session
# ends (conftest.py): `train` and `start_train` runs join it (ray.address=...) rather than each starting a private
# one, whose start-up (GCS, raylet, dashboard API server, agents, monitors, prestarted workers) costs ~8 CPU-s, a
# sixth of a small run's CPU on the 2-core CI machine. A run that declares its own resources or cluster (any ray.*
# override), or sets a launcher (its jobs run elsewhere), keeps a private cluster, as does every run with
# RLFARM_TEST_PRIVATE_RAY=1. The cluster declares more than any such run asks for: placement is still checked.
SHARED_RAY_CPUS, SHARED_RAY_GPUS = 16, 4
_shared_ray: RayNodes | None = None


def shared_ray_address() -> str | None:
    """The address of this test process's shared cluster (started now if it is not yet), or None when sharing
    is off."""
    global _shared_ray
    if os.environ.get("RLFARM_TEST_PRIVATE_RAY"):
        return None
    if _shared_ray is None:
        nodes = RayNodes(Path(tempfile.mkdtemp(prefix="rlsh")))  # short: Ray's socket paths live under it
        # not niced (its workers are the runs' roles) and Ray's own health check: on a loaded 2-core machine the
        # fast one could declare this, the only node, dead
        nodes.start_node("a", cpus=SHARED_RAY_CPUS, gpus=SHARED_RAY_GPUS, nice=False, fast_health_check=False,
                         object_store_mb=1000)
        _shared_ray = nodes
    return _shared_ray.address


def shared_ray_pids() -> set[int]:
    """The processes of this test process's shared cluster (none when it has not started one)."""
    return set(_shared_ray.nodes["a"].pids()) if _shared_ray is not None else set()


def stop_shared_ray() -> None:
    global _shared_ray
    if _shared_ray is not None:
        import shutil

        _shared_ray.stop()
        shutil.rmtree(_shared_ray.root, ignore_errors=True)
        _shared_ray = None


def on_shared_ray(overrides) -> list[str]:
    """`overrides` with ray.address of the shared cluster added, for a run that does not pick its own."""
    if any(o.startswith(("ray.", "hydra/launcher=", "resume=")) for o in overrides):
        return list(overrides)
    address = shared_ray_address()
    return [*overrides, f"ray.address={address}"] if address else list(overrides)


def train(run_dir, *overrides, timeout=600):
    """`rlfarm train` into `run_dir`, without the live view, on the shared cluster (`on_shared_ray`)."""
    return rlfarm("train", f"hydra.run.dir={run_dir}", "run.live=false", *on_shared_ray(overrides), timeout=timeout)


def start_rlfarm(*args, cwd=None):
    """`rlfarm <args>` in the background, in a session of its own (a test can signal it and its children); the
    Popen-like handle has pid, poll, wait, communicate, send_signal, kill, and stdout/stderr to read()."""
    if FRESH_PROCESSES:
        return subprocess.Popen([sys.executable, "-m", "rlfarm.cli", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=ENV, cwd=cwd, start_new_session=True)
    return driver_server.Driver([str(a) for a in args], cwd=cwd, env=ENV, new_session=True)


def start_train(run_dir, *overrides):
    """`rlfarm train` into `run_dir` in the background (start_rlfarm), without the live view, on the shared
    cluster (`on_shared_ray`)."""
    return start_rlfarm("train", f"hydra.run.dir={run_dir}", "run.live=false", *on_shared_ray(overrides))


def placement_probe() -> type:
    """An actor class that reports the GPU ids and node it holds, to place as a role would be (rlfarm plan's probe
    is a task). Made in a function so that Ray ships the class by value: its workers cannot import the tests."""
    class Probe:
        def where(self) -> dict:
            from rlfarm.commands.plan import where_am_i

            return where_am_i()
    return Probe


def one_line_error(out) -> str:
    lines = [line for line in out.stderr.strip().splitlines() if line.strip()]
    assert out.returncode == 2 and len(lines) == 1, (out.returncode, out.stderr[-2000:])
    return lines[0]


def read_summary(run_dir) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())


def metrics_rows(run_dir) -> list[dict]:
    """metrics.jsonl as rows; a line still being written (no closing brace yet) is left out."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]


def wait_for(predicate, timeout: float, every: float = 0.1) -> bool:
    """Poll `predicate` until it holds (True) or `timeout` seconds pass (False): no fixed sleeps in tests."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return False


def eval_returns(run_dir, episodes: int = 30, seed: int = 10_000) -> list[float]:
    """Returns (the env's own reward) of the run's final policy, mean action, in envs seeded seed, seed + 1, ..."""
    from rlfarm.evaluation import build_actor, load_trained_run, play_episode

    trained = load_trained_run(run_dir, "final")
    actor = build_actor(trained.cfg, trained.state["agent"]["actor"], trained.cfg.env)
    return [play_episode(actor, trained.cfg.env, seed=seed + i).episode_return for i in range(episodes)]


class RandomActor:
    """Uniform random actions in [low, high], seeded: the random-policy baseline."""

    def __init__(self, low, high, seed: int = 0):
        import numpy as np

        self.low, self.high, self.rng = np.asarray(low), np.asarray(high), np.random.default_rng(seed)

    def act(self, obs, deterministic=True):
        import torch

        return torch.from_numpy(self.rng.uniform(self.low, self.high, (len(obs), *self.low.shape)).astype("float32"))


class RecordingRunner:
    """An env runner's two learner-facing methods, called as Ray handles are (`.remote`), recorded here."""

    class _Method:
        def __init__(self, call):
            self.remote = call

    def __init__(self):
        self.acked: list[int] = []
        self.pushed: list[int] = []   # weight versions sent by receive_weights (start, load, push_weights)
        self.carried: list[int] = []  # weight versions that came with an ack
        self.ack = self._Method(self._ack)
        self.receive_weights = self._Method(lambda published: self.pushed.append(published[1]))

    def _ack(self, seqs, published=None):
        self.acked.extend(seqs)
        if published is not None:
            self.carried.append(published[1])

    @property
    def newest(self) -> int:
        return max(self.pushed + self.carried)


def report_of_one_run(run_dir, must_draw: set[str]) -> dict[str, list[str]]:
    """What `rlfarm report path=<run_dir>` draws (figure → panels, rlfarm/telemetry/panels.py), checked: the panels
    `must_draw` are among them, every panel drawn has a line, and report.md's row has a value in every column."""
    from rlfarm.telemetry.panels import PANELS
    from rlfarm.telemetry.plots import load_runs, series, write_report

    result = write_report(Path(run_dir), dpi=20)
    drawn = {panel for panels in result["panels"].values() for panel in panels}
    assert must_draw <= drawn, (must_draw - drawn, result["panels"])
    run = load_runs(Path(run_dir))[0]
    for panel in drawn:
        spec = PANELS[panel]
        assert any(len(series(run, key, spec.x)[0]) for key in spec.keys), f"panel {panel} would be empty"
    row = next(line for line in result["markdown"].read_text().splitlines() if line.startswith("| ") and "`.`" in line)
    assert " - |" not in row, row
    return result["panels"]

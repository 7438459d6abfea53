"""`rlfarm train algo=ppo`: PPO on gymnasium envs through the spine (rollout runners → learner → weights back),
run as a user runs it, in a subprocess."""
import json
import signal
import time

import pytest
import ray
import torch

from rlfarm.cluster import ray_session
from rlfarm.config import compose
from rlfarm.evaluation import build_actor, load_trained_run, play_episode
from rlfarm.families import PPO, family_of
from rlfarm.loops.ppo import PPOLoop
from rlfarm.run import Run
from rlfarm.topology import PlacedTopology, plan_topology
from helpers import report_of_one_run, rlfarm, start_rlfarm


def read_rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_ppo_learns_cartpole_to_400_within_300k_env_steps(tmp_path):
    run_dir = tmp_path / "run"
    out = rlfarm("train", "algo=ppo", "env=cartpole", "total_env_steps=300000", "algo.target_return=400",
                 f"hydra.run.dir={run_dir}", "run.live=false", "logger=none", timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["episode_return_mean"] >= 400 and summary["reached_target"], summary
    assert summary["env_steps"] <= 300_000
    rows = read_rows(run_dir)
    assert rows[0]["episode_return_mean"] is None or rows[0]["episode_return_mean"] < 100  # started near chance (~22)
    assert all(row["staleness"] == 0 for row in rows)  # synchronous: every rollout came from the newest weights
    # The final checkpoint plays through `rlfarm eval` (greedy actions).
    played = rlfarm("eval", f"run_dir={run_dir}", "episodes=3", "video=false", timeout=300)
    assert played.returncode == 0, played.stderr[-3000:]
    assert json.loads((run_dir / "eval" / "returns.json").read_text())["return_mean"] >= 400


def test_ppo_places_a_learner_and_env_runners_but_no_labeler():
    """The ppo family takes the env's own reward: a topology's labelers are not started for it."""
    cfg = compose("train", ["algo=ppo", "env=cartpole", "topology=local"])
    assert family_of(cfg) is PPO and cfg.model.actor._target_.endswith("ActorCritic")
    plan = plan_topology(cfg.topology, PPO)
    assert sorted(p.role for p in plan.placements) == ["env_runner", "learner"]
    assert compose("train", ["algo=ppo"]).topology.name == "local_ppo"  # its own default: one learner thread


def test_ppo_on_pendulum_is_preempted_resumes_and_its_checkpoint_plays(tmp_path):
    """Continuous actions (Gaussian policy), through Slurm's preemption path: SIGTERM → preempted.pt + exit 75 →
    resume=auto continues the counters; the resumed run stops exactly at its step budget (the last rollout is cut
    short), writes a complete run directory, and its final.pt plays as `rlfarm eval` plays it. One run for both
    (a session pair): the end-to-end checks read the resumed run's directory."""
    run_dir = tmp_path / "run"
    args = ["train", "algo=ppo", "env=pendulum", "total_env_steps=2000",
            "env.num_envs=2", "algo.epochs=2", f"hydra.run.dir={run_dir}", "run.live=false"]
    proc = start_rlfarm(*args)
    deadline = time.monotonic() + 240
    while not ((run_dir / "metrics.jsonl").exists() and len(read_rows(run_dir)) >= 3) and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode == 75, proc.stderr.read()[-2000:]
    assert json.loads((run_dir / "status.json").read_text())["status"] == "preempted"
    preempted = torch.load(run_dir / "checkpoints" / "preempted.pt", weights_only=True)["extra"]  # the driver's counters
    stopped_at = preempted["updates"]
    assert 3 <= stopped_at < 32
    per_env = 32 * stopped_at  # env steps of each of the 2 envs by then; 200-step episodes
    assert preempted["env_steps"] == 2 * per_env and preempted["episodes"] == 2 * (per_env // 200)

    out = rlfarm(*args, "resume=auto", timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == 2000 and summary["updates"] == 32  # 31 cycles of 2 × 32 steps, then 2 × 8
    # The resumed runners start fresh episodes: the one under way at SIGTERM is not counted, and no episode twice.
    assert summary["episodes"] == preempted["episodes"] + 2 * ((1000 - per_env) // 200)
    assert -2000 < summary["episode_return_mean"] < 0
    rows = read_rows(run_dir)
    assert [row["updates"] for row in rows] == list(range(1, 33))  # none lost, none repeated
    assert [row["env_steps"] for row in rows] == [64 * i for i in range(1, 32)] + [2000]
    assert all(row["staleness"] == 0 for row in rows)  # synchronous: every rollout came from the newest weights
    # One weight version a cycle: the warm-up publishes version 1 for update 1, ...; the resumed run publishes the
    # restored weights once more at its warm-up, so its versions are one ahead of the updates.
    assert [row["policy_version"] - row["updates"] for row in rows] == [0] * stopped_at + [1] * (32 - stopped_at)
    assert all(row["value_loss"] > 0 and row["entropy"] > 0 for row in rows)
    assert list((run_dir / "tb").glob("events.*"))
    report_of_one_run(run_dir, {"return_vs_steps", "policy_loss", "value_loss", "entropy", "approx_kl", "ppo_staleness"})
    state = torch.load(run_dir / "checkpoints" / "final.pt", weights_only=True)
    assert state["updates"] == 32 and "log_std" in state["agent"]["actor"]
    # what `rlfarm eval` does with it (the CLI itself is run on the CartPole run, in the slow test)
    run = load_trained_run(run_dir, "final")
    episode = play_episode(build_actor(run.cfg, run.state["agent"]["actor"], run.cfg.env), run.cfg.env, seed=0)
    assert episode.length == 200 and -2000 < episode.episode_return < 0


def test_ppo_resume_keeps_the_periodic_checkpoint_schedule(tmp_path):
    """With run.checkpoint_every_updates=4, a run that stopped after update 8 and resumes for two more updates
    writes no periodic checkpoint: the next one is due at 12, counted from the checkpoint it resumed (a loop that
    forgets the resume's update counts from 0 and writes step_9 at once). In-process: one Ray for both runs."""
    overrides = ["algo=ppo", "env=pendulum", "env.num_envs=2", "algo.epochs=1", "run.live=false", "logger=none",
                 "run.checkpoint_every_updates=4", "run.checkpoint_every_min=0"]
    cfg = compose("train", [*overrides, "total_env_steps=512"])  # 8 cycles of 2 × 32 steps
    plan = plan_topology(cfg.topology, PPO)
    with ray_session(cfg.ray, plan):
        placed = PlacedTopology(plan, float(cfg.ray.ready_timeout_s))
        run = Run(cfg, tmp_path)
        first = PPOLoop(cfg, run, placed)
        assert first.train()["updates"] == 8
        final = first.checkpoint()
        for actor in [first.learner, *first.runners]:  # frees the placement for the resumed run's roles
            ray.kill(actor)
        longer = compose("train", [*overrides, "total_env_steps=640"])  # two more cycles
        summary = PPOLoop(longer, run, placed, resume_from=final).train()
        run.metrics.close()
    assert summary["updates"] == 10 and summary["env_steps"] == 640
    assert sorted(p.name for p in run.checkpoint_dir.glob("step_*.pt")) == ["step_000000004.pt", "step_000000008.pt"]
    assert [row["updates"] for row in read_rows(tmp_path)] == list(range(1, 11))

"""rlfarm on a real Slurm: the submitit sweep launcher, the Ray-cluster sbatch, requeue and resume.

The cluster is the private one-node Slurm of conftest.py (this machine's CPUs, 2 in CI). Runs are tiny:
each asks 2 Ray CPUs (topology=local), so the jobs of a sweep run one after another. The first two tests
need no Slurm (launcher config composition, the two_node topology).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SBATCH = REPO / "launch" / "slurm" / "ray_cluster.sbatch"
TINY = ["algo.learning_starts=100", "algo.batch_size=32", "algo.chunk_steps=16",
        "model.actor.hidden=[32,32]", "model.critic.hidden=[32,32]", "run.live=false", "logger=none"]
NODE_CPUS = os.cpu_count() or 1
# Runs that get interrupted label slowly, so the run's pace is the labeling cost, not the machine's speed: the
# interrupt lands while the run is still going on a fast machine too.
SLOW_LABELS = ["reward=fixed_cost", "reward.batch_ms=400"]
REQUEUED_STEPS = 500  # the requeued runs: ~40 env steps/s with SLOW_LABELS, interrupted after ~200


def read_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def metrics_rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]


def ray_processes_of(job_id: str) -> list[str]:
    """Command lines of live processes that belong to this job's Ray (its temp dir is /tmp/ray-<job id>)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"/ray-{job_id}/" in cmdline or cmdline.rstrip().endswith(f"/ray-{job_id}"):
            found.append(cmdline[:200])
    return found


def sbatch(slurm, tmp_path: Path, *overrides: str, wait: bool, timeout: float = 600) -> tuple[subprocess.CompletedProcess, Path]:
    log = tmp_path / "job.log"
    env = {**slurm.env, "RLFARM_VENV": sys.prefix}
    env.pop("RAY_AUTH_MODE", None)  # the script's default: a per-job token guards the head
    args = ["sbatch", *(["--wait"] if wait else ["--parsable"]), f"--cpus-per-task={NODE_CPUS}", f"--output={log}",
            str(SBATCH), *overrides]
    try:
        out = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        slurm.cancel_all()
        pytest.fail(f"sbatch did not finish in {timeout:g} s; job log:\n{tail(log)}")
    return out, log


def tail(path: Path, n: int = 4000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else f"(no {path})"


GONE_GRACE_S = 60  # how long the sweep command may take to collect results once its jobs left the queue


def run_sweep(slurm, tmp_path: Path, args: list[str], timeout: float = 900, when=None, then=None) -> tuple[int, str]:
    """Run a sweep command (`rlfarm train -m hydra/launcher=slurm ...`) to its end; returns (exit code, output).
    `then(job_ids)` runs once, as soon as `when()` holds. Without accounting, submitit waits forever for a job
    that ended without a result (it failed outside Python, or was cancelled): when the queue has stayed empty
    for GONE_GRACE_S while the command still waits, the test fails with the jobs' error logs instead."""
    log = tmp_path / "sweep.log"
    with log.open("w") as out:
        process = subprocess.Popen(args, env=slurm.env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    seen_jobs, empty_since, done_then = False, None, then is None
    deadline = time.monotonic() + timeout
    try:
        while process.poll() is None:
            jobs = slurm.job_ids()
            seen_jobs = seen_jobs or bool(jobs)
            empty_since = None if jobs else (empty_since or time.monotonic())
            if not done_then and when():
                then(jobs)
                done_then, empty_since = True, None
            if seen_jobs and empty_since and time.monotonic() - empty_since > GONE_GRACE_S:
                errors = "".join(f"--- {p}\n{tail(p, 2000)}\n" for p in sorted(tmp_path.glob("**/.submitit/*/*_log.err")))
                pytest.fail(f"the sweep's jobs left the queue but the command still waits for results "
                            f"(a job ended without one):\n{errors}")
            if time.monotonic() > deadline:
                pytest.fail(f"sweep did not finish in {timeout:g} s; queue: {jobs}\n{tail(log)}")
            time.sleep(1)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
        slurm.cancel_all()
    assert done_then, "the sweep ended before the test could act on it"
    return process.returncode, log.read_text(errors="replace")



def test_launcher_config_takes_resources_from_topology():
    """Fast, no Slurm needed: hydra/launcher=slurm composes onto submitit's SlurmLauncher with CPUs/GPUs
    read from the topology, and the CLI preflight does not check this machine for a Slurm sweep."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    import rlfarm.resolvers  # noqa: F401  (rlfarm/cli.py imports it for the real CLI)
    from rlfarm.commands.common import launches_elsewhere
    from rlfarm.config import CONF_DIR

    def launcher(*overrides: str) -> dict:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("train", overrides=["hydra/launcher=slurm", *overrides], return_hydra_config=True)
        GlobalHydra.instance().clear()
        return OmegaConf.to_container(cfg.hydra.launcher, resolve=True)

    local = launcher()
    assert local["_target_"] == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert (local["cpus_per_task"], local["gpus_per_node"], local["nodes"]) == (2, None, 1)
    assert local["signal_delay_s"] == 120 and local["partition"] is None and local["account"] is None
    assert local["submitit_folder"].endswith("/.submitit/%j")
    split = launcher("topology=split_1_3", "hydra.launcher.partition=gpu", "hydra.launcher.timeout_min=30")
    assert (split["cpus_per_task"], split["gpus_per_node"]) == (15, 4)  # 1 + 8 + 6 role CPUs; pools 1 + 3
    assert (split["partition"], split["timeout_min"]) == ("gpu", 30)
    assert launcher("ray.num_cpus=8")["cpus_per_task"] == 8
    assert launches_elsewhere(["-m", "hydra/launcher=slurm", "seed=1,2"])


def test_two_node_topology_plans():
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from rlfarm.config import CONF_DIR
    from rlfarm.families import family_of
    from rlfarm.topology import plan_topology

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["topology=two_node"])
    GlobalHydra.instance().clear()
    plan = plan_topology(cfg.topology, family_of(cfg))
    assert plan.pool_gpus == {"train": 8, "reward": 8} and plan.total_gpus == 16
    # every GPU of both pools is used: learner + 14 env runners on node A, 16 labelers on node B
    for pool in ("train", "reward"):
        used = sorted({p.bundle for p in plan.placements if p.pool == pool})
        assert used == list(range(8)), (pool, used)
    assert (len(plan.of("env_runner")), len(plan.of("labeler"))) == (14, 16)


@pytest.mark.slow
@pytest.mark.slurm
def test_a_sweep_runs_one_slurm_job_per_point_and_a_failing_point_ends_it_with_its_error(slurm, tmp_path):
    """`rlfarm train -m hydra/launcher=slurm +env.kwargs.g=9.81,oops`: submitit sends a 2-task job array to Slurm,
    each task trains with the venv's python. Point 0 writes a complete run directory; point 1 fails at run time (a
    bad env kwarg only the env notices): its job must hand a result back (not exit silently), so the sweep command
    ends with the error instead of waiting forever. (A sweep that succeeds returns 0: test_requeued_sweep_job_resumes.)"""
    sweep = tmp_path / "sweep"
    args = [sys.executable, "-m", "rlfarm.cli", "train", "-m", "hydra/launcher=slurm", "+env.kwargs.g=9.81,oops",
            "total_env_steps=300", *TINY, f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=${hydra.job.num}"]
    code, output = run_sweep(slurm, tmp_path, args, timeout=600)
    assert "rlfarm.slurm_cpus" not in output, "rlfarm/cli.py must `import rlfarm.resolvers` (hydra/launcher=slurm uses them)"
    assert code != 0 and "a role failed" in output, output[-3000:]
    summary = json.loads((sweep / "0" / "summary.json").read_text())
    assert summary["env_steps"] == 300 and summary["transitions_produced"] == summary["transitions_stored"] == 300
    assert not (sweep / "1" / "summary.json").exists()
    assert json.loads((sweep / "1" / "status.json").read_text())["status"] == "failed"
    # It ran under Slurm: one array job, each task's hydra.job.id is "<array>_<index>".
    job_ids = {re.search(r"^    id: '?([^'\s]+)'?$", (sweep / point / ".hydra" / "hydra.yaml").read_text(), re.M).group(1)
               for point in ("0", "1")}
    assert len(job_ids) == 2 and all(re.fullmatch(r"\d+_[01]", j) for j in job_ids), job_ids
    (script,) = sweep.glob(".submitit/*/*_submission.sh")
    text = script.read_text()
    assert "--cpus-per-task=2" in text and "--signal=USR2@120" in text  # topology=local: 2 role CPUs
    assert "srun --unbuffered" in text and f" {sys.executable} -u -m submitit.core._submit" in text, text


def submit_and_interrupt(slurm, tmp_path: Path, interrupt: list[str], ready, *overrides: str) -> tuple[str, Path, Path]:
    """Submit the Ray sbatch; once `ready(run_dir)` holds, run the Slurm command `interrupt + [job id]`, then wait
    until the job (rerun included) has left the queue. Returns (job id, job log, run dir)."""
    run_dir = tmp_path / "run"
    out, log = sbatch(slurm, tmp_path, *TINY, *SLOW_LABELS, f"hydra.run.dir={run_dir}", *overrides, wait=False,
                      timeout=60)
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 420
        while not ready(run_dir):
            if slurm.job_state(job_id) is None:
                pytest.fail(f"job {job_id} ended before it could be interrupted:\n{tail(log)}")
            if time.monotonic() > deadline:
                pytest.fail(f"training did not get far enough in 420 s:\n{tail(log)}")
            time.sleep(1)
        assert not (run_dir / "summary.json").exists(), "the run finished before it was interrupted: raise total_env_steps"
        done = slurm.run(*interrupt, job_id)
        assert done.returncode == 0, done.stderr
        assert slurm.wait_gone(job_id, 600), f"job {job_id} did not finish in 600 s after {interrupt}:\n{tail(log)}"
    finally:
        slurm.cancel_all()
    return job_id, log, run_dir


def assert_resumed_to_completion(log: Path, run_dir: Path, total: int, checkpoints: tuple[str, ...]) -> str:
    text = tail(log, 100000)
    assert "(restart 0)" in text and "(restart 1)" in text, text[-4000:]
    rerun = text.split("(restart 1)", 1)[1]
    resumed = re.search(r"resumed from (\S+) at (\d+) env steps", rerun)
    assert resumed and Path(resumed.group(1)).name.startswith(checkpoints), rerun[-4000:]
    assert int(resumed.group(2)) > 0
    summary = read_summary(run_dir)
    assert summary["env_steps"] == total and summary["transitions_stored"] == total
    steps = [row["env_steps"] for row in metrics_rows(run_dir)]
    assert steps == sorted(steps), "metrics.jsonl went back in env steps: the rerun did not continue"
    return rerun


def has_step_checkpoint(run_dir: Path) -> bool:
    return bool(list((run_dir / "checkpoints").glob("step_*.pt"))) if (run_dir / "checkpoints").is_dir() else False


@pytest.mark.slow
@pytest.mark.slurm
def test_requeued_job_restarts_and_resumes(slurm, tmp_path):
    """launch/slurm/ray_cluster.sbatch on the one-node cluster (Ray head via srun, token auth on, the node joins,
    `rlfarm train ray.address=...`), preempted as Slurm does it: `scontrol requeue` sends TERM to every process of
    the running job, Ray included; the trap tears down, Slurm starts the job again (SLURM_RESTART_COUNT=1) and the
    rerun, with the script's default resume=auto, continues from the newest periodic checkpoint to completion
    with a summary, and the trap leaves no Ray process behind."""
    job_id, log, run_dir = submit_and_interrupt(slurm, tmp_path, ["scontrol", "requeue"], has_step_checkpoint,
                                                f"total_env_steps={REQUEUED_STEPS}", "run.checkpoint_every_updates=50")
    text = tail(log, 100000)
    assert "1 of 1 Ray node(s) up" in text and "rlfarm train ray.address=" in text
    assert f"job {job_id} on" in text and "got TERM" in text and "tearing down (status 143)" in text
    # a periodic one, or preempted.pt when the driver managed to write it before Ray went down
    rerun = assert_resumed_to_completion(log, run_dir, REQUEUED_STEPS, ("step_", "preempted"))
    assert "tearing down (status 0)" in rerun
    assert not ray_processes_of(job_id)


@pytest.mark.slow
@pytest.mark.slurm
def test_time_limit_warning_checkpoints_requeues_and_resumes(slurm, tmp_path):
    """The graceful path: USR1 to the batch script (what --signal=B:USR1@180 sends before the time limit) → the
    driver gets TERM while Ray still runs, writes checkpoints/preempted.pt and exits 75 → the script tears Ray
    down and requeues its own job → the rerun resumes from preempted.pt and completes."""
    job_id, log, run_dir = submit_and_interrupt(
        slurm, tmp_path, ["scancel", "--batch", "--signal=USR1"], lambda d: len(metrics_rows(d)) >= 3,
        f"total_env_steps={REQUEUED_STEPS}", "run.checkpoint_every_updates=0", "run.checkpoint_every_min=0")
    text = tail(log, 100000)
    first = text.split("(restart 1)", 1)[0]
    assert "USR1: time limit close" in first and "rlfarm train exited with 75" in first, first[-4000:]
    assert f"requeueing job {job_id}" in first
    assert_resumed_to_completion(log, run_dir, REQUEUED_STEPS, ("preempted.pt",))
    assert not ray_processes_of(job_id)


@pytest.mark.slow
@pytest.mark.slurm
def test_requeued_sweep_job_resumes(slurm, tmp_path):
    """The same through the submitit launcher: `scontrol requeue` on a running sweep job → Slurm reruns it in
    the same run dir (Hydra keeps the sweep dir across the rerun) → with resume=auto it continues from its
    newest checkpoint; the sweep command still collects the result and returns 0."""
    sweep = tmp_path / "sweep"
    run_dir = sweep / "0"
    args = [sys.executable, "-m", "rlfarm.cli", "train", "-m", "hydra/launcher=slurm", "seed=1",
            f"total_env_steps={REQUEUED_STEPS}",
            *TINY, *SLOW_LABELS, "resume=auto", "run.checkpoint_every_updates=50", f"hydra.sweep.dir={sweep}",
            "hydra.sweep.subdir=${hydra.job.num}"]

    def requeue(job_ids: list[str]) -> None:
        assert not (run_dir / "summary.json").exists(), "the run finished before it was requeued"
        (job_id,) = job_ids
        done = slurm.run("scontrol", "requeue", job_id)
        assert done.returncode == 0, done.stderr

    code, output = run_sweep(slurm, tmp_path, args, when=lambda: has_step_checkpoint(run_dir), then=requeue)
    assert code == 0, output[-3000:]
    job_logs = "".join(p.read_text(errors="replace") for p in sorted(sweep.glob(".submitit/*/*_log.out")))
    assert job_logs.count("Starting with JobEnvironment") == 2, job_logs[-4000:]  # first run + rerun
    resumed = re.search(r"resumed from (\S+) at (\d+) env steps", job_logs)
    assert resumed and Path(resumed.group(1)).name.startswith(("step_", "preempted")) and int(resumed.group(2)) > 0
    summary = read_summary(run_dir)
    assert summary["env_steps"] == summary["transitions_stored"] == REQUEUED_STEPS
    steps = [row["env_steps"] for row in metrics_rows(run_dir)]
    assert steps == sorted(steps), "metrics.jsonl went back in env steps: the rerun did not continue"

import os
from pathlib import Path

import pytest

from helpers import TINY_SAC, on_shared_ray, rlfarm, shared_ray_address, stop_shared_ray

# Tests start their own Ray; keep it local, quiet and without a dashboard.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


# `make test` runs the suite on xdist workers with `--dist loadfile`: a module is one unit of work (its
# module-scoped Ray starts once). (`--dist loadgroup` would let the modules sharing the session's trained runs go
# to one worker, but pytest 9.2 ignores the node-id suffix xdist 3.8 groups by.) Units start longest first, so no
# long one is left to run alone at the end; the list is the CI's --durations, heaviest first.
SHARED_RUNS = ("tests/cli/test_cli.py", "tests/commands/test_eval.py", "tests/commands/test_fit_reward.py",
               "tests/commands/test_report.py")
LONGEST_FIRST = (
    "tests/loops/test_sac_learns.py", "tests/slurm/test_slurm.py", *SHARED_RUNS, "tests/multinode/test_two_nodes.py",
    "tests/loops/test_vla_simplevla.py",
    "tests/loops/test_worker_failure.py", "tests/loops/test_offpolicy_deadlines.py",
    "tests/loops/test_onpolicy_faults.py", "tests/loops/test_actor_learner_cartpole.py",
    "tests/loops/test_ppo_cartpole.py", "tests/loops/test_onpolicy_topologies.py",
    "tests/loops/test_ppo_lm_digits.py", "tests/loops/test_grpo_resume.py", "tests/loops/test_vla_ppo.py",
    "tests/loops/test_resume.py", "tests/loops/test_reward_faults.py",
)


def _rank(item) -> int:
    path = item.nodeid.split("::", 1)[0]
    return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config, items):
    import torch

    if os.environ.get("PYTEST_XDIST_WORKER"):  # one process keeps the files' order
        items.sort(key=_rank)  # stable: a module's tests keep their order
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _stop_the_shared_ray():
    """The shared cluster of `train`/`start_train` runs and `ray_cpu` (helpers.py), if this process started one."""
    yield
    stop_shared_ray()


@pytest.fixture(scope="module")
def ray_cpu():
    """A real Ray for one test module, with 4 GPUs *declared* so placement can be tested on CPU: this process joins
    the shared cluster (helpers.shared_ray_address), or starts a private one where sharing is off."""
    import ray

    address = shared_ray_address()
    if address:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    else:
        ray.init(address="local", num_cpus=16, num_gpus=4, include_dashboard=False, _node_ip_address="127.0.0.1",
                 log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module", autouse=True)
def _no_ray_left_behind():
    """A module that leaves Ray running breaks every later module that starts its own ("ray.init twice"), far
    from the cause: shut it down here and name the module that leaked it."""
    yield
    import ray

    if ray.is_initialized():
        ray.shutdown()
        pytest.fail("this test module left Ray running (something called a Ray API outside an actor?)")


@pytest.fixture(autouse=True)
def _restore_thread_settings():
    """Roles built in-process (e.g. the VLA rollout worker) call limit_threads, which sets torch's threads and
    OMP_NUM_THREADS for the whole process; later tests (and tools like nproc that obey it) must not inherit that."""
    import torch

    threads, omp = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    yield
    torch.set_num_threads(threads)
    if omp is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = omp


@pytest.fixture
def one_torch_thread():
    """For tiny models: extra threads only add overhead (and stall on a shared 2-core machine).
    `_restore_thread_settings` puts the previous count back after the test."""
    import torch

    torch.set_num_threads(1)


# One tiny real training sweep (2 seeds, via the CLI in a subprocess), shared by the sweep, eval and report tests.
# 400 env steps in 50-step Pendulum episodes: 8 episodes a run, returns logged, a checkpoint written.
TINY_SWEEP = ["total_env_steps=400", *TINY_SAC, "run.live=false", "logger=none", "+env.kwargs.max_episode_steps=50"]


def _train_sweep(root):
    # both jobs join this worker's shared cluster (helpers.on_shared_ray): two private Ray starts saved
    args = ["train", "-m", "seed=1,2", f"hydra.sweep.dir={root}", "hydra.sweep.subdir=${hydra.job.num}",
            *on_shared_ray(TINY_SWEEP)]
    out = rlfarm(*args, cwd=root)
    if out.returncode != 0 and "timed out during startup" in out.stderr:
        # Ray's raylet/GCS can miss its start-up deadline on a CI box whose 2 cores are busy: one more try.
        out = rlfarm(*args, cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (root / "0" / "summary.json").exists() and (root / "1" / "summary.json").exists()
    return root


@pytest.fixture(scope="session")
def tiny_sweep(tmp_path_factory):
    """A multirun dir with runs 0/ (seed=1) and 1/ (seed=2), each a complete run directory. Under xdist the
    workers share one build (the modules that use it land on either worker: each would start its own two Ray
    sessions): the first to ask trains it, under a lock, and names it in a file beside the workers' temp dirs."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return _train_sweep(tmp_path_factory.mktemp("sweep"))
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent  # this pytest run's temp dir, above every worker's own
    built = shared / "tiny_sweep.path"
    with FileLock(str(shared / "tiny_sweep.lock")):
        if built.exists():
            return Path(built.read_text())
        root = _train_sweep(tmp_path_factory.mktemp("sweep"))  # a failed build names nothing: the next one retries
        built.write_text(str(root))
        return root

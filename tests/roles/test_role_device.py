"""Where a role runs when it is built in-process (tests, benches) rather than as a Ray actor."""
import ray

from rlfarm.roles.common import assigned_device


def test_outside_ray_a_role_runs_on_cpu_and_does_not_start_ray():
    # ray.get_gpu_ids() starts a local Ray when none is up; that one leaked into every later test of a session
    assert not ray.is_initialized()
    assert assigned_device() == "cpu"
    assert not ray.is_initialized()

import os

import pytest

# Tests start their own Ray; keep it local, quiet and without a dashboard.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def ray_cpu():
    """A real local Ray for one test module, with 4 GPUs *declared* so placement can be tested on CPU."""
    import ray

    ray.init(num_cpus=16, num_gpus=4, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()

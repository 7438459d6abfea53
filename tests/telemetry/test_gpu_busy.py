"""GpuBusySampler: averages what its reader reports, per GPU, over the time it is entered."""
import time

import pytest

from rlfarm.telemetry.gpu_busy import GpuBusySampler, nvml_available


def test_sampler_averages_each_asked_gpu_over_the_window():
    readings = iter([{0: 100.0, 1: 7.0}, {0: 50.0, 1: 7.0}] * 1000)
    with GpuBusySampler(gpus=[0], interval_s=0.01, read=lambda: next(readings)) as sampler:
        time.sleep(0.2)
    means = sampler.mean_percent()
    assert list(means) == [0]  # GPU 1 was not asked for
    assert len(sampler.samples[0]) >= 5 and 50.0 <= means[0] <= 100.0


@pytest.mark.skipif(nvml_available(), reason="NVML works here")
def test_without_nvml_the_sampler_fails_at_once_in_the_caller():
    with pytest.raises(RuntimeError, match="NVML is not available"):
        with GpuBusySampler():
            pass


@pytest.mark.gpu
def test_nvml_sees_a_spinning_kernel():
    import torch

    with GpuBusySampler(gpus=[0], interval_s=0.05) as sampler:
        for _ in range(10):
            torch.cuda._sleep(200_000_000)  # ~0.1 s each at H100 clocks
        torch.cuda.synchronize()
    assert sampler.mean_percent()[0] > 50

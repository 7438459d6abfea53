"""How busy GPUs are while something runs, sampled from NVML (the `pynvml` module of nvidia-ml-py).

NVML's utilization.gpu is the share of its last sample period (1/6 s to 1 s, by card) in which at least one
kernel ran; averaged over a window it is the GPU's busy fraction, whichever process keeps it busy, without
touching that process. NVML numbers GPUs in PCI bus order; CUDA and Ray do too on a machine of identical
GPUs (CUDA orders by speed first), which is the case on the GPU machines here.
"""
from __future__ import annotations

import functools
import statistics
import threading
import time
from collections.abc import Callable, Iterable


@functools.cache
def _nvml():
    """pynvml, initialized once per process; None where it is missing or finds no driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # no package, no driver, no GPU: the sampler is then unavailable
        return None


def nvml_available() -> bool:
    return _nvml() is not None


def nvml_utilization() -> dict[int, float]:
    """Percent of the last NVML sample period each GPU ran a kernel, by NVML index."""
    nvml = _nvml()
    if nvml is None:
        raise RuntimeError("NVML is not available here (pip install nvidia-ml-py on a machine with an NVIDIA driver)")
    return {i: float(nvml.nvmlDeviceGetUtilizationRates(nvml.nvmlDeviceGetHandleByIndex(i)).gpu)
            for i in range(nvml.nvmlDeviceGetCount())}


class GpuBusySampler:
    """Polls `read` (NVML by default: {gpu: percent}) every `interval_s` in a thread while entered; then
    `mean_percent()` gives each GPU's mean over the samples. `gpus` keeps only those GPUs (None: all)."""

    def __init__(self, gpus: Iterable[int] | None = None, interval_s: float = 0.1,
                 read: Callable[[], dict[int, float]] = nvml_utilization):
        self.gpus = None if gpus is None else sorted(set(gpus))
        self.interval_s, self.read = interval_s, read
        self.samples: dict[int, list[float]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuBusySampler:
        self.read()  # fail here, in the caller's thread, when the reader cannot work
        self._thread = threading.Thread(target=self._poll, name="gpu-busy-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            for gpu, percent in self.read().items():
                if self.gpus is None or gpu in self.gpus:
                    self.samples.setdefault(gpu, []).append(percent)
            self._stop.wait(max(self.interval_s - (time.monotonic() - started), 0.0))

    def mean_percent(self) -> dict[int, float]:
        return {gpu: statistics.fmean(values) for gpu, values in sorted(self.samples.items()) if values}

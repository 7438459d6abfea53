"""Index samplers over a storage; separate from the storage so that other schemes (prioritized, recent-first)
can replace uniform sampling without touching how data is kept."""
from __future__ import annotations

import torch


class UniformSampler:
    """Indices drawn uniformly with replacement from the filled part of the storage, on its device."""

    def __init__(self, batch_size: int, generator_seed: int | None = None):
        self.batch_size = int(batch_size)
        self.generator_seed = generator_seed
        self._generator: torch.Generator | None = None

    def sample(self, size: int, device: torch.device) -> torch.Tensor:
        if self._generator is None or self._generator.device != device:
            self._generator = torch.Generator(device=device)
            if self.generator_seed is not None:
                self._generator.manual_seed(self.generator_seed)
        return torch.randint(0, size, (self.batch_size,), device=device, generator=self._generator)

    def sample_into(self, index: torch.Tensor, size: torch.Tensor) -> torch.Tensor:
        """Fill `index` (int64, any shape, e.g. [updates, batch_size]) with uniform draws from [0, size), in place.

        `size` is a 0-d float64 tensor on index's device holding the number of filled rows, updated in place by
        the caller as the storage grows. No host sync and no shape that depends on the size: a CUDA graph can
        capture this, and its replays follow the buffer's growth. It draws from the device's default generator,
        the one `torch.cuda.graph` registers with a capture (this sampler's own would need registering by hand).
        float64 uniforms: exact enough to index buffers of millions of rows without bias."""
        draws = torch.rand(index.shape, dtype=torch.float64, device=index.device)
        return index.copy_(draws.mul_(size))

    def state_dict(self) -> dict:
        return {"seed": self.generator_seed,
                "rng": self._generator.get_state() if self._generator is not None else None}

    def load_state_dict(self, state: dict) -> None:
        self.generator_seed = state.get("seed")
        self._generator = None
        if state.get("rng") is not None:
            self._generator = torch.Generator(device="cpu")
            self._generator.set_state(state["rng"])

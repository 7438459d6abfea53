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

    def state_dict(self) -> dict:
        return {"seed": self.generator_seed,
                "rng": self._generator.get_state() if self._generator is not None else None}

    def load_state_dict(self, state: dict) -> None:
        self.generator_seed = state.get("seed")
        self._generator = None
        if state.get("rng") is not None:
            self._generator = torch.Generator(device="cpu")
            self._generator.set_state(state["rng"])

"""The generation-engine interface the on-policy loop talks to; it returns a `rlfarm.data.Rollout`
(the log-probability convention every engine keeps is stated there)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from rlfarm.data import Rollout, StopIds
from rlfarm.sync.base import WeightReceiver


def hits_stop(token: torch.Tensor, ids: tuple[int, ...]) -> torch.Tensor:
    """token == any stop id, as comparisons with constants: no tensor is made, so a CUDA graph can capture it."""
    hit = token == ids[0]
    for other in ids[1:]:
        hit = hit | (token == other)
    return hit


class Engine(ABC):
    """Generates rollouts with versioned weights; can give its accelerator memory back between rounds."""

    weight_version: int

    @abstractmethod
    def generate(self, prompt_ids: list[list[int]], n: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, eos_id: StopIds = None) -> Rollout:
        """Sample n completions per prompt (temperature 0: greedy); a sample stops at any id of eos_id."""

    @abstractmethod
    def update_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Load these tensors (all weights, or a subset such as LoRA adapters) and tag later rollouts with version."""

    @abstractmethod
    def sleep(self) -> None:
        """Release accelerator memory (weights, KV cache) so a colocated learner can use it."""

    @abstractmethod
    def wake(self) -> None:
        """Take the accelerator back after `sleep`."""


def load_into(engine: Engine, receiver: WeightReceiver, sent: Any, version: int) -> int:
    """Receive every part of a weight sync (`rlfarm.sync`) into `engine` and tag its later rollouts with `version`.
    Returns the bytes loaded. The engine's side of the sync: engines import `sync/`, never the reverse."""
    loaded = 0
    for part in receiver.receive(sent):
        engine.update_weights(part, version)
        loaded += sum(t.numel() * t.element_size() for t in part.values())
    engine.weight_version = version
    return loaded

"""Senders whose payload is the state dict itself: through Ray's object store, or within one process."""
from __future__ import annotations

from collections.abc import Mapping

import torch

from rlfarm.sync.base import WeightSender


class HostSender(WeightSender):
    """CPU copies of the tensors (detached, never aliasing the learner's), for the caller to `ray.put` once."""

    def send(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {name: tensor.detach().to("cpu", copy=True) for name, tensor in state.items()}


class InPlaceSender(WeightSender):
    """The learner's own tensors: a colocated engine in the same process copies straight from them."""

    def send(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {name: tensor.detach() for name, tensor in state.items()}

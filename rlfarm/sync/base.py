"""The two ends of a weight sync. A sender publishes a state dict (name → tensor); a receiver hands the
tensors to whoever loads them, in parts, so a transport can reuse a small receive buffer."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from rlfarm.engines.base import Engine


class WeightSender(ABC):
    @abstractmethod
    def send(self, state: Mapping[str, torch.Tensor]) -> Any:
        """Publish `state`. Returns what the caller must hand to each receiver (None when the transport itself
        carries the tensors)."""


class WeightReceiver(ABC):
    # True when `receive` meets the sender's `send` in a collective: the two must run at the same time, so the
    # receiving side starts before the sender's call has returned (and reads what it returned afterwards).
    meets_sender: bool = False

    @abstractmethod
    def receive(self, sent: Any = None) -> Iterator[dict[str, torch.Tensor]]:
        """The published tensors, part by part; a part is valid until the next one is asked for."""


class PassThroughReceiver(WeightReceiver):
    """For transports whose payload already is the state dict (object store, in place): one part."""

    def receive(self, sent: Any = None) -> Iterator[dict[str, torch.Tensor]]:
        yield dict(sent)


def load_into(engine: Engine, receiver: WeightReceiver, sent: Any, version: int) -> int:
    """Receive every part into `engine` and tag its later rollouts with `version`. Returns the bytes loaded."""
    loaded = 0
    for part in receiver.receive(sent):
        engine.update_weights(part, version)
        loaded += sum(t.numel() * t.element_size() for t in part.values())
    engine.weight_version = version
    return loaded

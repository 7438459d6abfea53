"""The two ends of a weight sync, whatever the transport. A sender publishes a state dict (name → tensor) as the
next version; a receiver hands the tensors to whoever loads them, in parts, so a transport can reuse a small
receive buffer. Loading the parts into a generation engine is the engine's side (`rlfarm.engines.base.load_into`):
`sync/` knows tensors and versions, not engines or roles."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from typing import Any

import torch

Publication = tuple[Any, int]  # (what each receiver reads: a boxed ref, IPC handles, None over a broadcast; version)


class WeightSender(ABC):
    """One per learner (its publishing rank): `version` is the run's one weight-version counter, counted here, where
    the weights leave, and restored from a checkpoint (`version = ...`)."""

    version: int = 0

    @abstractmethod
    def send(self, state: Mapping[str, torch.Tensor]) -> Any:
        """Move `state`. Returns what the caller must hand to each receiver (None when the transport itself
        carries the tensors)."""

    def publish(self, state: Mapping[str, torch.Tensor]) -> Publication:
        """Send `state` as the next version: (what the receivers read, that version)."""
        self.version += 1
        return self.send(state), self.version


class WeightReceiver(ABC):
    # True when `receive` meets the sender's `send` in a collective: the two must run at the same time, so the
    # receiving side starts before the sender's call has returned (and reads what it returned afterwards).
    meets_sender: bool = False

    @abstractmethod
    def receive(self, sent: Any = None) -> Iterator[dict[str, torch.Tensor]]:
        """The published tensors, part by part; a part is valid until the next one is asked for."""


class PassThroughReceiver(WeightReceiver):
    """For a payload that already is the state dict (in place, or host copies handed over as they are): one part."""

    def receive(self, sent: Any = None) -> Iterator[dict[str, torch.Tensor]]:
        yield dict(sent)

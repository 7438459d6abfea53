"""The object-store transport: the learner puts each new version's CPU copies in Ray's object store once, and each
receiver (a runner's policy copy, a VLA inference server, an LLM engine on CPU) fetches the newest version it was
handed, once per version. The one module of `sync/` that speaks to Ray.

A publication is `([ref], version)`: the ref is boxed in a list so that a Ray call hands it over unresolved, and a
receiver fetches the tensors only for a version new to it. Outside Ray (single-process tests and benches) the box
holds the state itself."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import ray
import torch

from rlfarm.sync.base import Publication, WeightReceiver
from rlfarm.sync.local import HostSender


def box(state: Mapping[str, torch.Tensor]) -> list:
    """`state` (CPU tensors) put once: [its ref] under Ray, [the state] outside it."""
    return [ray.put(state) if ray.is_initialized() else state]


def publication(state: Mapping[str, torch.Tensor], version: int) -> Publication:
    """Put `state` (CPU tensors) once, as weight version `version`."""
    return box(state), version


class ObjectStoreSender(HostSender):
    """CPU copies of the tensors (never aliasing the learner's), put once; the publication carries the boxed ref."""

    def send(self, state: Mapping[str, torch.Tensor]) -> list:
        return box(super().send(state))


class ObjectStoreReceiver(WeightReceiver):
    """Fetches a boxed state (a plain state dict, as `HostSender` hands over, is taken as it is): one part."""

    def receive(self, sent: Any = None) -> Iterator[dict[str, torch.Tensor]]:
        yield unbox(sent)


def unbox(sent: Any) -> dict[str, torch.Tensor]:
    if isinstance(sent, list):
        (sent,) = sent
    return dict(ray.get(sent) if isinstance(sent, ray.ObjectRef) else sent)


class HeldWeights:
    """A receiver's side: the version of the weights its policy copy holds (0: the copy's initial weights)."""

    def __init__(self):
        self.version = 0
        self.receiver = ObjectStoreReceiver()

    def load_newer(self, published: Publication | None, into: Callable[[dict], object]) -> bool:
        """Hand the state of `published` to `into` (e.g. a module's `load_state_dict`) if it is newer than the
        version held, fetching it here; returns whether it was loaded."""
        if published is None or published[1] <= self.version:
            return False
        sent, version = published
        for part in self.receiver.receive(sent):
            into(part)
        self.version = version
        return True

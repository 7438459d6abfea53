"""The versioned weight hand-off from a learner to the policy copies its runners act with (SAC env runners,
PPO rollout runners, VLA rollout workers): the learner puts each new version in the object store once, and a
runner loads the newest version it was handed, between chunks or rollouts, once per version.

A publication is `([ref], version)`: the ref is boxed in a list so that a Ray call hands it over unresolved,
and a runner fetches the tensors only for a version new to it. Outside Ray (single-process tests and benches)
the box holds the state itself.

The object-store transport of `rlfarm.sync`, beside NCCL broadcast and CUDA IPC (the LLM engines' senders and
receivers): the one module of `sync/` that speaks to Ray."""
from __future__ import annotations

from collections.abc import Callable, Mapping

import ray
import torch

Publication = tuple[list, int]  # ([ref of the state], version)


def publication(state: Mapping[str, torch.Tensor], version: int) -> Publication:
    """Put `state` (CPU tensors) once, as weight version `version`."""
    return [ray.put(state) if ray.is_initialized() else state], version


class HeldWeights:
    """A runner's side: the version of the weights its policy copy holds (0: the copy's initial weights)."""

    def __init__(self):
        self.version = 0

    def load_newer(self, published: Publication | None, into: Callable[[dict], object]) -> bool:
        """Hand the state of `published` to `into` (e.g. a module's `load_state_dict`) if it is newer than the
        version held, fetching it here; returns whether it was loaded."""
        if published is None or published[1] <= self.version:
            return False
        (held,), version = published
        into(ray.get(held) if isinstance(held, ray.ObjectRef) else held)
        self.version = version
        return True

"""The object-store transport's sender for a learner that must not stall: the farm's learners (SAC, IMPALA, APPO)
publish every few updates from inside their update loop.

Why this shape: a plain `.cpu()` of a CUDA tensor waits for every queued update to finish, so publishing every
few updates emptied the GPU's queue each time and the learner ran at a fraction of its bench speed. Here the
update thread only queues copies into pinned host buffers behind the updates (same stream, so they see the
weights as of that point) and records an event; a publishing thread waits for the event and does the put. One
offer waits at most: a newer offer replaces one not yet taken, so a slow object store makes publications rarer,
never the updates slower. On CPU the copy is a memcpy and there is no event; the put is still off the update
thread."""
from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

import torch

from rlfarm.sync.base import Publication
from rlfarm.sync.local import HostSender
from rlfarm.sync.object_store import publication


class WeightPublisher:
    """`live`: the learner's current tensors (e.g. its actor's `state_dict`), read on the update thread; `device`:
    where they live. `published`: the newest publication out, `([ref], version)`, or None before the first."""

    def __init__(self, live: Callable[[], Mapping[str, torch.Tensor]], device: torch.device | str):
        self.live, self.on_cuda = live, torch.device(device).type == "cuda"
        self.published: Publication | None = None
        self._pending: tuple[int, int, dict, torch.cuda.Event | None] | None = None  # (generation, version, ...)
        self._generation = 0  # publish_now() starts a new one: offers made before it are dropped
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def offer(self, version: int) -> None:
        """On the update thread: start copying the weights off the device as `version`; published soon."""
        copies = {name: torch.empty(t.shape, dtype=t.dtype, pin_memory=self.on_cuda).copy_(t.detach(), non_blocking=True)
                  for name, t in self.live().items()}
        event = None
        if self.on_cuda:
            event = torch.cuda.Event()
            event.record()
        with self._cond:
            self._pending = (self._generation, version, copies, event)
            self._cond.notify()
            if self._thread is None or self._closed:  # first offer, or one after close() (run() again)
                self._closed = False
                self._thread = threading.Thread(target=self._publish_offers, name="weight-publisher", daemon=True)
                self._thread.start()

    def publish_now(self, version: int) -> None:
        """Publish the current weights as `version` before returning (start, load); drops unfinished offers."""
        state = HostSender().send(self.live())
        with self._cond:
            self._generation += 1
            self._pending = None
            self.published = publication(state, version)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _publish_offers(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._pending is None:
                    return
                (generation, version, copies, event), self._pending = self._pending, None
            if event is not None:
                event.synchronize()
            put = publication(copies, version)
            with self._cond:  # not one made before publish_now(), nor one older than what is out already
                if generation == self._generation and (self.published is None or version > self.published[1]):
                    self.published = put

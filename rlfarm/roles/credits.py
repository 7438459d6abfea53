"""A runner's credits: the backpressure of the off-policy family, for the env runner and for the bench's stand-in
runner alike.

A runner holds `count` credits. Sending a chunk spends one, and the runner keeps the chunk (its meta and object
ref) until the learner acks it: the learner acks once the chunk is stored and the updates it owes are done, and
the credit comes back. With no credit left the runner waits, so a slow labeling farm or learner pauses acting
instead of piling up memory. Because the runner holds every chunk in flight, a chunk survives the death of the
labeler it went to: `redispatch` sends that labeler's chunks again (the learner stores each id once)."""
from __future__ import annotations

import threading

import ray

from rlfarm.chunk import ChunkMeta

POLL_S = 0.1  # how often a wait for a credit looks at the stop flag


class Credits:
    def __init__(self, count: int):
        self._free = threading.Semaphore(count)
        # seq → (meta, chunk ref, labeler index), until the learner acks it
        self.in_flight: dict[int, tuple[ChunkMeta, ray.ObjectRef, int]] = {}
        self._lock = threading.Lock()

    def take(self, stop: threading.Event) -> bool:
        """Wait for a free credit and take it: True, or False once `stop` is set."""
        while not self._free.acquire(timeout=POLL_S):
            if stop.is_set():
                return False
        return True

    def give_back(self) -> None:
        """Return a credit taken but not spent (no chunk was sent with it)."""
        self._free.release()

    def send(self, meta: ChunkMeta, ref: ray.ObjectRef, labelers: list) -> None:
        """Spend the credit taken on this chunk: hand it to labeler seq mod N and hold it until it is acked."""
        labeler = meta["seq"] % len(labelers)
        with self._lock:
            self.in_flight[meta["seq"]] = (meta, ref, labeler)
        labelers[labeler].submit.remote(meta, ref)

    def acked(self, seqs: list[int]) -> None:
        """The learner is done with these chunks: their credits come back (a seq acked twice counts once)."""
        with self._lock:
            for seq in seqs:
                if self.in_flight.pop(seq, None) is not None:
                    self._free.release()

    def redispatch(self, labeler: int, labelers: list) -> int:
        """Labeler `labeler` died (and was restarted): send it again the chunks it held. Returns the chunks re-sent."""
        with self._lock:
            lost = [(meta, ref) for meta, ref, to in self.in_flight.values() if to == labeler]
        for meta, ref in lost:
            labelers[labeler].submit.remote(meta, ref)
        return len(lost)

    def __len__(self) -> int:
        """Chunks sent and not yet acked."""
        return len(self.in_flight)

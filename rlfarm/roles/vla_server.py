"""A batching inference server for VLA rollout workers (SEED-RL's central inference; issue 17).

Rollout workers send one policy call's observations (picture, instruction tokens, proprio) and wait for the
sampled action tokens and their log-probabilities. The server queues the requests of all its workers and runs the
policy once per batch: a batch fires when `max_batch` observations are waiting or `max_wait_ms` after its first
request arrived, like the labelers' bus. One thread runs the policy; weights arrive by the same versioned
publication the workers take (`load_weights`, between rollouts), and every answer says which version sampled it.
A worker keeps its two env groups double-buffered: while it waits for one group's answer, its env thread steps the
other group, so the server gets requests from every worker's groups in turn and sees large batches.

What it records (`stats`): batches, requests and observations served, the busy time of the policy thread, and the
largest batch, so the driver can report how full the batches were and how busy the server was.
"""
from __future__ import annotations

import queue
import threading
import time

import numpy as np
import torch

from rlfarm.algos.vla import VLAConfig
from rlfarm.roles.common import assigned_device, limit_threads
from rlfarm.roles.versioned_weights import HeldWeights, Publication
from rlfarm.roles.vla import build_policy, load_trainable


class _Request:
    def __init__(self, inputs: tuple[np.ndarray, np.ndarray, np.ndarray]):
        self.inputs, self.done = inputs, threading.Event()
        self.result: tuple[np.ndarray, np.ndarray, int] | None = None
        self.error: BaseException | None = None


class VLAInferenceServer:
    def __init__(self, cfg: VLAConfig, shapes: dict[str, int], max_batch: int = 256, max_wait_ms: float = 5.0,
                 threads: int = 1, device: str | None = None):
        limit_threads(threads)
        self.cfg, self.max_batch, self.max_wait_s = cfg, int(max_batch), float(max_wait_ms) / 1000
        self.device = device or assigned_device()
        self.policy = build_policy(cfg, shapes).to(self.device).eval()
        self.generator = torch.Generator(self.device).manual_seed(cfg.seed * 7919 + 104729)
        self.weights = HeldWeights()
        self._requests: queue.Queue[_Request] = queue.Queue()
        self._policy_lock = threading.Lock()  # a weight load never lands in the middle of a batch
        self.batches = self.requests = self.observations = self.largest = 0
        self.busy_s, self.started = 0.0, time.perf_counter()
        threading.Thread(target=self._serve, name="vla-inference", daemon=True).start()

    def load_weights(self, weights: Publication | None) -> int:
        """The learner's publication (loaded if newer than the held one); returns the version now held."""
        with self._policy_lock:
            self.weights.load_newer(weights, lambda state: load_trainable(self.policy, state))
        return self.weights.version

    def sample(self, image: np.ndarray, words: np.ndarray, proprio: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """One worker's policy call for B observations: (tokens [B, K·D], their log-probs at the rollout temperature,
        the weight version that sampled them). Waits for the batch it joins."""
        request = _Request((np.asarray(image), np.asarray(words), np.asarray(proprio)))
        self._requests.put(request)
        request.done.wait()
        if request.error is not None:
            raise request.error
        return request.result

    def stats(self) -> dict:
        wall = time.perf_counter() - self.started
        return {"batches": self.batches, "requests": self.requests, "observations": self.observations,
                "largest_batch": self.largest, "busy_s": self.busy_s, "wall_s": wall,
                "policy_version": self.weights.version}

    # -- the policy thread ----------------------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            batch = self._gather()
            started = time.perf_counter()
            try:
                self._run(batch)
            except BaseException as error:  # noqa: BLE001 - each waiting worker gets it raised in its call
                for request in batch:
                    request.error = error
            finally:
                for request in batch:
                    request.done.set()
            self.busy_s += time.perf_counter() - started

    def _gather(self) -> list[_Request]:
        """Requests until max_batch observations wait or max_wait has passed since the first one came."""
        batch = [self._requests.get()]
        rows, deadline = len(batch[0].inputs[0]), time.perf_counter() + self.max_wait_s
        while rows < self.max_batch:
            left = deadline - time.perf_counter()
            try:
                request = self._requests.get(timeout=left) if left > 0 else self._requests.get_nowait()
            except queue.Empty:
                break
            batch.append(request)
            rows += len(request.inputs[0])
        return batch

    @torch.no_grad()
    def _run(self, batch: list[_Request]) -> None:
        image, words, proprio = (torch.as_tensor(np.concatenate([r.inputs[i] for r in batch])).to(self.device)
                                 for i in range(3))
        with self._policy_lock:
            tokens, logprobs = self.policy.sample(image, words, proprio, self.cfg.temperature, self.generator)
            version = self.weights.version
        tokens, logprobs = tokens.cpu().numpy(), logprobs.cpu().numpy()
        at = 0
        for request in batch:
            n = len(request.inputs[0])
            request.result = (tokens[at:at + n], logprobs[at:at + n], version)
            at += n
        self.batches += 1
        self.requests += len(batch)
        self.observations += at
        self.largest = max(self.largest, at)

"""A batching inference server for VLA rollout workers (SEED-RL's central inference; issue 17).

Rollout workers send one policy call's observations (picture, instruction tokens, proprio) and wait for the
sampled action tokens and their log-probabilities. The server queues the requests of all its workers and runs the
policy once per batch: a batch fires when `max_batch` observations are waiting or `max_wait_ms` after its first
request arrived, like the labelers' bus. One thread runs the policy; weights arrive by the same versioned
publication the workers take (`receive_weights`, an engine role's one way in, between rollouts), and every answer says
which version sampled it.
A worker keeps its two env groups double-buffered: while it waits for one group's answer, its env thread steps the
other group, so the server gets requests from every worker's groups in turn and sees large batches.

What it records (`stats`): batches, requests and observations served, the busy time of the policy thread (its
"infer" stage; "idle" while it waits for requests), and the largest batch, so the driver can report how full the batches were and how busy the server was.

Speed (issue 17), both on a GPU only, where the loaded checkpoint is an HF VLA (`model.source`):
- `dtype="auto"` runs the HF model in bfloat16 (the learner keeps its float32 copy; published weights are cast on
  load). The tiny built-in VLA stays float32 (launch-bound: bf16 would only add casts).
- `graphs=True`: the action tokens after the first are decoded by CUDA-graph replays (`GraphedDecoding`): the
  picture and prompt go through the model eagerly into a static KV cache, then each of the K×D - 1 token steps
  replays one captured forward of the language model, the batch padded up to the next captured size. Eager HF
  decoding of a 24-layer model is bound by Python and kernel launches (~10 ms a token whatever the batch); a
  replay launches the whole step at once. If capture fails the server says so in `stats()["graphs"]` and decodes
  eagerly.
"""
from __future__ import annotations

import os
import queue
import threading
import time

import numpy as np
import ray
import torch

from rlfarm.algos.vla import VLAConfig
from rlfarm.models.gqa_decoding import use_packed_gqa_decoding
from rlfarm.models.vla import sample_action_token
from rlfarm.roles.base import role
from rlfarm.roles.common import assigned_device, limit_threads
from rlfarm.roles.stage_clock import StageClock
from rlfarm.roles.vla import build_policy, load_trainable
from rlfarm.sync.base import Publication
from rlfarm.sync.object_store import HeldWeights

GRAPH_BUCKETS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048)  # batch sizes decoding is captured for (up to max_batch)


def inference_dtype(policy, device: str, dtype: str = "auto") -> torch.dtype:
    """The dtype a rollout copy of `policy` runs in: "auto" is bfloat16 for an HF VLA on a GPU, else float32."""
    if dtype == "auto":
        is_hf = hasattr(policy, "policy") and hasattr(policy.policy, "model")
        return torch.bfloat16 if is_hf and str(device).startswith("cuda") else torch.float32
    return getattr(torch, dtype)


def inference_policy(cfg: VLAConfig, shapes: dict[str, int], device: str, dtype: str = "auto"):
    """A rollout copy of the policy on `device`, in eval mode, its HF model cast to `inference_dtype`."""
    policy = build_policy(cfg, shapes).to(device).eval()
    if hasattr(policy, "policy"):  # an HF VLA: decode steps read the KV cache without copying it per step
        use_packed_gqa_decoding(policy.policy.model)
    wanted = inference_dtype(policy, device, dtype)
    if wanted != torch.float32:
        if not hasattr(policy, "policy"):
            raise ValueError(f"dtype={dtype}: only an HF VLA (model.source) runs in reduced precision")
        policy.policy.model.to(wanted)  # the value head and the picture statistics stay float32
    return policy


class _Request:
    def __init__(self, inputs: tuple[np.ndarray, np.ndarray, np.ndarray]):
        self.inputs, self.done = inputs, threading.Event()
        self.result: tuple[np.ndarray, np.ndarray, int] | None = None
        self.error: BaseException | None = None


@role("engine")
class VLAInferenceServer:
    def __init__(self, cfg: VLAConfig, shapes: dict[str, int], max_batch: int = 256, max_wait_ms: float = 5.0,
                 threads: int = 1, device: str | None = None, dtype: str = "auto", graphs: bool = False):
        limit_threads(threads)
        self.cfg, self.max_batch, self.max_wait_s = cfg, int(max_batch), float(max_wait_ms) / 1000
        self.device = device or assigned_device()
        self.policy = inference_policy(cfg, shapes, self.device, dtype)
        self.dtype = str(inference_dtype(self.policy, self.device, dtype)).removeprefix("torch.")
        self.decoding, self.graphs = None, "off"
        if graphs:
            self.decoding, self.graphs = GraphedDecoding.build(self.policy, self.device, self.max_batch)
        self.generator = torch.Generator(self.device).manual_seed(cfg.seed * 7919 + 104729)
        self.weights = HeldWeights()
        self._requests: queue.Queue[_Request] = queue.Queue()
        self._policy_lock = threading.Lock()  # a weight load never lands in the middle of a batch
        self.batches = self.requests = self.observations = self.largest = 0
        self.clock, self.started = StageClock("idle", "infer"), time.perf_counter()
        threading.Thread(target=self._serve, name="vla-inference", daemon=True).start()

    def receive_weights(self, published: Publication | None) -> int:
        """The learner's publication (loaded if newer than the held one); returns the version now held."""
        with self._policy_lock:
            self.weights.load_newer(published, lambda state: load_trainable(self.policy, state))
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
        wall, stage_s = time.perf_counter() - self.started, self.clock.snapshot()
        return {"pid": os.getpid(), "batches": self.batches, "requests": self.requests, "observations": self.observations,
                "largest_batch": self.largest, "busy_s": stage_s["infer"], "wall_s": wall, "stage_s": stage_s,
                "policy_version": self.weights.version, "dtype": self.dtype, "graphs": self.graphs}

    # -- the policy thread ----------------------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            batch = self.clock.timed("idle", self._gather)
            try:
                self.clock.timed("infer", self._run, batch)
            except BaseException as error:  # noqa: BLE001 - each waiting worker gets it raised in its call
                for request in batch:
                    request.error = error
            finally:
                for request in batch:
                    request.done.set()

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
            if self.decoding is not None:
                tokens, logprobs = self.decoding.sample(image, words, self.cfg.temperature, self.generator)
            else:
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


def remote_server_class():
    """VLAInferenceServer as a Ray actor class (the caller sets `max_concurrency`: every worker's waiting calls)."""
    return ray.remote(VLAInferenceServer)


class GraphedDecoding:
    """`HFVLAActions.sample` with the action-token steps after the first replayed from CUDA graphs.

    One static KV cache and one captured decode step per batch size in `buckets`; a batch is padded (repeating its
    last row) to the smallest bucket that holds it, and one larger than every bucket is decoded eagerly. The prompt
    (picture placeholders + instruction, fixed length P) is run eagerly into the static cache; step t then feeds
    the token sampled at step t-1 at cache position P+t-1 with a 4-D boolean mask (the prompt's padding mask, then
    the positions decoded so far), which the model takes as is, so nothing in the step depends on host values.
    Sampling (log-softmax over the action bins, multinomial with the server's generator) stays outside the graph
    and is the same arithmetic as `HFVLAPolicy.sample`, so the learner's teacher-forced recompute matches.
    `capture=False` runs the same static-cache path eagerly (CPU tests check it against the learner)."""

    def __init__(self, actions, buckets: tuple[int, ...], capture: bool = True):
        self.actions, self.policy = actions, actions.policy
        self.model, self.capture = self.policy.model, bool(capture)
        self.buckets = tuple(sorted(int(b) for b in buckets))
        self.prompt = actions.image_tokens + actions.tokenizer.max_words
        self.length = self.prompt + self.policy.num_tokens
        self.steps: dict[int, dict] = {}
        self.pool = None

    @classmethod
    def build(cls, policy, device: str, max_batch: int) -> tuple[GraphedDecoding | None, str]:
        """(decoding, what `stats` says): captured for every bucket up to max_batch, or None and the reason."""
        if not hasattr(policy, "image_tokens"):
            return None, "off (the tiny VLA decodes in one pass)"
        if not str(device).startswith("cuda"):
            return None, "off (CPU)"
        buckets = tuple(b for b in GRAPH_BUCKETS if b < max_batch) + (int(max_batch),)
        try:
            decoding = cls(policy, buckets)
            for size in sorted(buckets, reverse=True):  # largest first: the smaller ones reuse its pool's memory
                decoding.step_for(size, torch.device(device))
            # one whole sample (eager prompt into the static cache, then replays), so a failure shows here, not in a
            # worker's call
            image = torch.zeros(2, 3, policy.image_size, policy.image_size, dtype=torch.uint8, device=device)
            words = torch.full((2, policy.tokenizer.max_words), policy.tokenizer.pad_id, device=device)
            decoding.sample(image, words, 1.0, torch.Generator(device).manual_seed(0))
            torch.cuda.synchronize()
            return decoding, f"on (batch sizes {', '.join(map(str, buckets))})"
        except Exception as error:  # noqa: BLE001 - eager decoding still works; the reason goes into stats
            torch.cuda.synchronize()
            return None, f"off (capture failed: {type(error).__name__}: {str(error)[:200]})"

    def step_for(self, size: int, device: torch.device) -> dict:
        """The static buffers (+ captured graph) of one bucket, built on first use."""
        if size in self.steps:
            return self.steps[size]
        from transformers import StaticCache

        step = {"cache": StaticCache(config=self.model.config, max_cache_len=self.length),
                "ids": torch.zeros(size, 1, dtype=torch.long, device=device),
                "position": torch.full((1,), self.prompt, dtype=torch.long, device=device),
                "mask": torch.zeros(size, 1, 1, self.length, dtype=torch.bool, device=device)}
        step["mask"][..., : self.prompt + 1] = True
        if self.capture:
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side), torch.no_grad():
                for _ in range(2):  # allocates the cache's layers and lets kernels pick their algorithms
                    self._forward(step)
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            self.pool = self.pool or torch.cuda.graph_pool_handle()
            with torch.cuda.graph(graph, pool=self.pool), torch.no_grad():
                step["logits"] = self._forward(step)
            step["graph"] = graph
        self.steps[size] = step
        return step

    def _forward(self, step: dict) -> torch.Tensor:
        out = self.model(input_ids=step["ids"], attention_mask=step["mask"], cache_position=step["position"],
                         use_cache=True, logits_to_keep=1, **{self.policy._cache_kwarg: step["cache"]})
        return out.logits

    def _decode(self, step: dict) -> torch.Tensor:
        if "graph" in step:
            step["graph"].replay()
            return step["logits"]
        return self._forward(step)

    @torch.no_grad()
    def sample(self, image: torch.Tensor, words: torch.Tensor, temperature: float = 1.0,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens [B, K*D] as bin indices, their log-probs), as `HFVLAActions.sample(image, words, ...)`."""
        rows = len(words)
        size = next((b for b in self.buckets if b >= rows), None)
        if size is None:  # larger than every captured batch
            proprio = torch.zeros(rows, 0, device=words.device)
            return self.actions.sample(image, words, proprio, temperature, generator)
        if size > rows:  # pad with copies of the last row; their samples are dropped
            image = torch.cat([image, image[-1:].expand(size - rows, *image.shape[1:])])
            words = torch.cat([words, words[-1:].expand(size - rows, *words.shape[1:])])
        pixels, ids, prompt_mask = self.actions._inputs(image, words)
        if ids.shape[1] != self.prompt:
            raise ValueError(f"prompt of {ids.shape[1]} tokens, decoding was built for {self.prompt}")
        step = self.step_for(size, ids.device)
        _rewind(step["cache"])
        first = self.policy.first_action_id
        out = self.model(input_ids=ids, pixel_values=pixels, attention_mask=prompt_mask, use_cache=True,
                         cache_position=torch.arange(self.prompt, device=ids.device), logits_to_keep=1,
                         **{self.policy._cache_kwarg: step["cache"]})
        logits = out.logits
        step["mask"][:, 0, 0, : self.prompt] = prompt_mask.bool()
        step["mask"][:, 0, 0, self.prompt:] = False
        tokens, logprobs = [], []
        for t in range(self.policy.num_tokens):
            if t:
                step["ids"].copy_((tokens[-1] + first).unsqueeze(1))
                step["position"].fill_(self.prompt + t - 1)
                step["mask"][:, 0, 0, self.prompt + t - 1] = True
                logits = self._decode(step)
            token, logprob = sample_action_token(logits[:, -1, first:], temperature, generator)
            tokens.append(token)
            logprobs.append(logprob)
        return torch.stack(tokens, 1)[:rows], torch.stack(logprobs, 1)[:rows]


def _rewind(cache) -> None:
    """Empty a static cache for the next prompt. Newer transformers write a static layer at its own running length
    (a device tensor the captured step advances in place), older ones at `cache_position`: zero the former."""
    for layer in getattr(cache, "layers", ()):
        length = getattr(layer, "cumulative_length", None)
        if isinstance(length, torch.Tensor):
            length.zero_()

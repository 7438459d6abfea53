"""EnvRunner role: steps a vector env with its own copy of the policy and emits chunks of raw transitions.

A chunk carries no reward: only what the reward model needs (`needs`, e.g. the env's own reward or
rendered frames). It is put in the object store once; only its ref travels to a labeler. Each runner
holds `credits`: one is spent per chunk and returned by the learner once the chunk is stored and the
updates it owes are done, so a slow labeling farm or learner pauses acting instead of piling up memory.
"""
from __future__ import annotations

import glob
import os
import sys
import threading
import time
from collections import deque

import numpy as np
import ray
import torch
from hydra.utils import instantiate

from rlfarm.envs.vector import VectorEnv
from rlfarm.roles.common import limit_threads, seed_everything
from rlfarm.roles.versioned_weights import HeldWeights, Publication


def spread_rendering(index: int) -> None:
    """Runners render headless through EGL; left alone, every runner draws on GPU 0 and it becomes the
    bottleneck (docs/benchmarks.md, split_1_3). Spread them over the node's GPUs. Runners hold no CUDA share,
    so count the device files, not CUDA."""
    if os.environ.get("MUJOCO_GL") != "egl" or "MUJOCO_EGL_DEVICE_ID" in os.environ:
        return
    gpus = len(glob.glob("/dev/nvidia[0-9]*"))
    if gpus:
        os.environ["MUJOCO_EGL_DEVICE_ID"] = str(index % gpus)


class EnvRunner:
    def __init__(self, index: int, env_cfg: dict, actor_cfg: dict, needs: list[str], frame_size: int | None,
                 seed: int, chunk_steps: int, credits: int, random_steps: int, threads: int = 1):
        limit_threads(threads)
        seed_everything(seed + 7919 * index)
        spread_rendering(index)
        self.index, self.needs, self.chunk_steps, self.random_steps = index, list(needs), chunk_steps, random_steps
        self.env = VectorEnv(env_cfg["id"], env_cfg.get("num_envs", 1), seed + 1000 * index,
                             frame_size, dict(env_cfg.get("kwargs") or {}))
        space = self.env.single_action_space
        self.obs_dim = int(np.prod(self.env.single_observation_space.shape))
        self.act_dim = int(np.prod(space.shape))
        self.action_low, self.action_high = space.low.astype(np.float32), space.high.astype(np.float32)
        self.policy = instantiate(actor_cfg)(self.obs_dim, self.act_dim, self.action_low, self.action_high).eval()
        self.rng = np.random.default_rng(seed + 7919 * index)
        self.credits = threading.Semaphore(credits)
        # seq → (meta, chunk ref, labeler index), until the learner acks it: this runner owns the chunk, so it
        # survives a labeler's death and can be sent again.
        self.in_flight: dict[int, tuple[dict, ray.ObjectRef, int]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pending_weights: Publication | None = None  # the newest handed over, loaded before the next chunk
        self.weights = HeldWeights()
        self.labelers: list = []
        self.env_steps = self.produced = self.chunks = 0
        self.max_env_steps = sys.maxsize  # run() and set_budget() lower it
        self.credit_wait_s = 0.0
        self.finished_returns: deque[float] = deque()
        self.finished_lengths: deque[int] = deque()

    # -- wiring ------------------------------------------------------------------------------------
    def spaces(self) -> dict:
        return {"obs_dim": self.obs_dim, "act_dim": self.act_dim,
                "action_low": self.action_low, "action_high": self.action_high}

    def set_labelers(self, labelers: list) -> None:
        self.labelers = list(labelers)

    def set_weights(self, published: Publication) -> None:
        """Called by the learner on publication; the tensors are fetched when the next chunk starts."""
        with self._lock:
            if self._pending_weights is None or published[1] > self._pending_weights[1]:
                self._pending_weights = published

    def ack(self, seqs: list[int]) -> None:
        """The learner stored these chunks and did the updates they owe: give the credits back."""
        with self._lock:
            for seq in seqs:
                if self.in_flight.pop(seq, None) is not None:
                    self.credits.release()

    def redispatch(self, labeler: int) -> int:
        """A labeler died (and was restarted): send it again the chunks it held. A chunk it had already
        delivered is stored once anyway (the learner de-duplicates by id). Returns the chunks re-sent."""
        with self._lock:
            lost = [(meta, ref) for meta, ref, to in self.in_flight.values() if to == labeler]
        for meta, ref in lost:
            self.labelers[labeler].submit.remote(meta, ref)
        return len(lost)

    def stop(self) -> None:
        self._stop.set()

    def set_budget(self, max_env_steps: int) -> None:
        """Lower this runner's step budget mid-run (its predecessor's last chunks turned up late)."""
        self.max_env_steps = min(max_env_steps, self.max_env_steps)

    # -- acting ------------------------------------------------------------------------------------
    def _refresh_policy(self) -> None:
        with self._lock:
            pending, self._pending_weights = self._pending_weights, None
        self.weights.load_newer(pending, self.policy.load_state_dict)

    def _act(self, obs: np.ndarray) -> np.ndarray:
        if self.env_steps < self.random_steps:
            return self.rng.uniform(self.action_low, self.action_high, size=(obs.shape[0], self.act_dim)).astype(np.float32)
        with torch.no_grad():
            action = self.policy.act(torch.as_tensor(obs, dtype=torch.float32).reshape(obs.shape[0], -1))
        return action.numpy()

    def _collect_chunk(self, obs: np.ndarray, steps: int) -> tuple[dict, np.ndarray]:
        fields: dict[str, list] = {k: [] for k in ("obs", "action", "next_obs", "terminated", "truncated", *self.needs)}
        for _ in range(steps):
            action = self._act(obs)
            step = self.env.step(action)
            fields["obs"].append(obs)
            fields["action"].append(action)
            fields["next_obs"].append(step.next_obs)
            fields["terminated"].append(step.terminated)
            fields["truncated"].append(step.truncated)
            for key in self.needs:
                fields[key].append(getattr(step, key))
            self.finished_returns.extend(step.episode_returns)
            self.finished_lengths.extend(step.episode_lengths)
            self.env_steps += obs.shape[0]
            obs = step.obs
        # [steps, envs, ...] → [steps * envs, ...]: the labelers and the buffer see flat transitions.
        chunk = {k: np.concatenate(v, axis=0) for k, v in fields.items()}
        return chunk, obs

    def run(self, max_env_steps: int, first_seq: int = 0, incarnation: int = 0, random_steps: int | None = None) -> dict:
        """Act until `max_env_steps` (this runner's share) or stop(); returns this runner's totals.
        `first_seq` keeps chunk ids of a resumed run or a restarted runner apart from those stored before;
        `incarnation` tags its chunks so the learner can count what each incarnation delivered; a restarted
        runner is told how many random steps it still owes (usually none: it acts with the learner's policy)."""
        if random_steps is not None:
            self.random_steps = random_steps
        # A budget lowered by set_budget before this call started (threaded actor: no order) still holds.
        self.max_env_steps = min(max_env_steps, self.max_env_steps)
        obs = self.env.reset()
        seq = first_seq
        while self.env_steps < self.max_env_steps and not self._stop.is_set():
            waited = time.monotonic()
            while not self.credits.acquire(timeout=0.1):
                if self._stop.is_set():
                    return self.totals()
            self.credit_wait_s += time.monotonic() - waited
            self._refresh_policy()
            # The last chunk is cut short so the run stops at its step budget, not a chunk later.
            steps = min(self.chunk_steps, -(-(self.max_env_steps - self.env_steps) // obs.shape[0]))
            if steps <= 0:  # the budget was lowered while waiting for a credit
                self.credits.release()
                break
            chunk, obs = self._collect_chunk(obs, steps)
            meta = {"runner": self.index, "seq": seq, "incarnation": incarnation, "produced_at": time.time(),
                    "policy_version": self.weights.version, "size": len(chunk["obs"])}
            ref = ray.put(chunk)
            labeler = seq % len(self.labelers)
            with self._lock:
                self.in_flight[seq] = (meta, ref, labeler)
            self.labelers[labeler].submit.remote(meta, ref)
            self.produced += meta["size"]
            self.chunks += 1
            seq += 1
        return self.totals()

    def totals(self) -> dict:
        return {"runner": self.index, "env_steps": self.env_steps, "produced": self.produced, "chunks": self.chunks}

    def stats(self) -> dict:
        returns, lengths = [], []
        while self.finished_returns:
            returns.append(self.finished_returns.popleft())
        while self.finished_lengths:
            lengths.append(self.finished_lengths.popleft())
        return {**self.totals(), "pid": os.getpid(), "episode_returns": returns, "episode_lengths": lengths,
                "credit_wait_s": self.credit_wait_s, "policy_version": self.weights.version,
                "in_flight": len(self.in_flight)}

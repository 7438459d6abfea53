"""EnvRunner role: steps a vector env with its own copy of the policy and emits chunks of raw transitions.

A chunk (rlfarm/chunk.py) carries no reward: the fields every chunk has, and what the reward model needs
(`needs`, e.g. rendered frames). It is put in the object store once; only its ref travels to a labeler. Each
runner holds `credits` (rlfarm/roles/credits.py): one is spent per chunk and returned by the learner once the
chunk is stored and the updates it owes are done, so a slow labeling farm or learner pauses acting.

The frame path: the runner's vector env writes every step (frames included, rendered at the reward model's
input size) straight into preallocated [chunk_steps, num_envs, ...] arrays, in worker processes' shared memory
when `env.workers` > 0; the chunk is a flat view of them, so `ray.put` is the only copy after the renderer's.
Time is kept per stage (stats()["stage_s"], disjoint: they add up to the runner's time): act (policy forward and
weight loads), step (stepping the sub-envs and waiting on the workers, less the rendering), render (the frames;
with workers, each step's mean over the worker processes, which render at once), credit_wait, send (ray.put and
submit).
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import ray
import torch
from hydra.utils import instantiate

from rlfarm.chunk import RECORDED, STEPPED, Chunk, ChunkMeta, flat
from rlfarm.envs.rendering import headless_rendering, limit_software_rendering, spread_rendering
from rlfarm.envs.spaces import policy_dims
from rlfarm.envs.step_buffers import StepBuffers
from rlfarm.envs.vector import VectorEnv
from rlfarm.roles.base import role
from rlfarm.roles.common import assigned_device, limit_threads, seed_everything
from rlfarm.roles.credits import Credits
from rlfarm.roles.stage_clock import StageClock
from rlfarm.sync.object_store import HeldWeights, Publication


@role("runner")
class EnvRunner:
    def __init__(self, index: int, env_cfg: dict, actor_cfg: dict, needs: list[str], frame_size: int | None,
                 seed: int, chunk_steps: int, credits: int, random_steps: int, threads: int = 1, frame_stack: int = 1,
                 behaviour: bool = False):
        """behaviour: record log μ(a|s) of every action taken (an actor-learner's V-trace needs them); the policy is
        then an actor-critic (`sample_with_logprob`, `to_env`), and a Box action's raw sample travels too (`sampled_action`: the
        env gets it clipped into the box, log μ is of the raw sample)."""
        limit_threads(threads)
        seed_everything(seed + 7919 * index)
        headless_rendering()  # before the env imports MuJoCo: it picks its GL backend then
        spread_rendering(index, env_cfg.get("render_gpus"))
        workers = int(env_cfg.get("workers", 0))
        limit_software_rendering(threads // max(1, workers))
        self.index, self.needs, self.chunk_steps, self.random_steps = index, list(needs), chunk_steps, random_steps
        self.env = VectorEnv(env_cfg["id"], int(env_cfg.get("num_envs", 1)), seed + 1000 * index,
                             frame_size, dict(env_cfg.get("kwargs") or {}), workers,
                             batch_render=bool(env_cfg.get("batch_render", False)), frame_stack=frame_stack,
                             groups=int(env_cfg.get("groups", 1)))
        self.buffers: StepBuffers = self.env.step_buffers(chunk_steps)
        missing = [key for key in self.needs if key not in RECORDED or getattr(self.buffers, key) is None]
        if missing:
            raise ValueError(f"the reward model needs {missing}, which a runner does not record "
                             f"(it records {', '.join(RECORDED)}; frames need a frame_size)")
        self._carry_row: int | None = None  # the row of buffers.obs the next chunk starts from (None: reset first)
        self._spaces = policy_dims(self.env.single_observation_space, self.env.single_action_space)
        self.obs_dim, self.act_dim = self._spaces["obs_dim"], self._spaces["act_dim"]
        self.action_low, self.action_high = self._spaces["action_low"], self._spaces["action_high"]
        # A runner given a GPU share acts there (a conv policy on pixels is the runner's cost, not the env); the
        # observations go up as they are (uint8 images: a quarter of the bytes) and become float32 on the device.
        self.device = torch.device(assigned_device())
        self.policy = instantiate(actor_cfg)(self.obs_dim, self.act_dim, self.action_low, self.action_high)
        self.policy = self.policy.to(self.device).eval()
        self.rng = np.random.default_rng(seed + 7919 * index)
        self.behaviour = self._behaviour_arrays(chunk_steps) if behaviour else {}
        self.credits = Credits(credits)
        self._lock = threading.Lock()  # the weights handed over, between the caller's thread and the acting one
        self._stop = threading.Event()
        self._pending_weights: Publication | None = None  # the newest handed over, loaded before the next chunk
        self.weights = HeldWeights()
        self.labelers: list = []
        self.env_steps = self.produced = self.chunks = 0
        self.first_step_at: float | None = None  # time.time() of this runner's first env step (the run's startup_s)
        self.max_env_steps = sys.maxsize  # run() and set_budget() lower it
        self.stages = StageClock("act", "step", "render", "credit_wait", "send")
        self.finished_returns: deque[float] = deque()
        self.finished_lengths: deque[int] = deque()

    # -- wiring ------------------------------------------------------------------------------------
    def spaces(self) -> dict:
        return self._spaces

    def set_labelers(self, labelers: list) -> None:
        self.labelers = list(labelers)

    def receive_weights(self, published: Publication) -> int:
        """The learner's weights (at start, after a load or a restart, and riding on acks): kept as the newest
        handed over, their tensors fetched when the next chunk starts. Returns the version the runner acts with
        from its next chunk on."""
        with self._lock:
            if self._pending_weights is None or published[1] > self._pending_weights[1]:
                self._pending_weights = published
            return max(self._pending_weights[1], self.weights.version)

    def ack(self, seqs: list[int], published: Publication | None = None) -> None:
        """The learner stored these chunks and did the updates they owe: give the credits back. `published`, the
        learner's newest weights riding on the ack, is received as `receive_weights` receives them."""
        if published is not None:
            self.receive_weights(published)
        self.credits.acked(seqs)

    def redispatch(self, labeler: int) -> int:
        """A labeler died (and was restarted): send it again the chunks it held. A chunk it had already
        delivered is stored once anyway (the learner de-duplicates by id). Returns the chunks re-sent."""
        return self.credits.redispatch(labeler, self.labelers)

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        """Stop the env's worker processes (run() does this when it returns)."""
        self.env.close()

    def set_budget(self, max_env_steps: int) -> None:
        """Lower this runner's step budget mid-run (its predecessor's last chunks turned up late)."""
        self.max_env_steps = min(max_env_steps, self.max_env_steps)

    def _behaviour_arrays(self, steps: int) -> dict[str, np.ndarray]:
        arrays = {"logprob": np.zeros((steps, self.env.num_envs), np.float32)}
        if self.action_low is not None:  # a Box
            arrays["sampled_action"] = np.zeros((steps, self.env.num_envs, self.act_dim), np.float32)
        return arrays

    # -- acting ------------------------------------------------------------------------------------
    def _refresh_policy(self) -> None:
        with self._lock:
            pending, self._pending_weights = self._pending_weights, None
        self.weights.load_newer(pending, self.policy.load_state_dict)

    def _act(self, obs: np.ndarray, t: int, columns: slice = slice(None)) -> np.ndarray:
        """The actions for obs [B, ...] (sub-envs `columns` at step t), behaviour log-probs recorded if asked."""
        return self._finish_act(self._launch_act(obs, t, columns))

    def _launch_act(self, obs: np.ndarray, t: int, columns: slice) -> "PendingAct":
        """Start the policy forward for obs: on a GPU it is only queued, and its results are copied into pinned
        host memory behind it, so the caller can step other sub-envs while it runs (`_finish_act` waits)."""
        if not self.behaviour and self.env_steps < self.random_steps:
            random = self.rng.uniform(self.action_low, self.action_high, size=(obs.shape[0], self.act_dim))
            return PendingAct({"action": random.astype(np.float32)}, None, t, columns)
        with torch.no_grad():
            if self.behaviour:
                action, logprob = self.policy.sample_with_logprob(self._tensor(obs))
                outputs = {"action": self.policy.to_env(action), "logprob": logprob}
                if "sampled_action" in self.behaviour:
                    outputs["sampled_action"] = action.reshape(obs.shape[0], -1)
            else:
                outputs = {"action": self.policy.act(self._tensor(obs))}
        if self.device.type != "cuda":
            return PendingAct({k: v.numpy() for k, v in outputs.items()}, None, t, columns)
        host = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True).copy_(v, non_blocking=True)
                for k, v in outputs.items()}
        event = torch.cuda.Event()
        event.record()
        return PendingAct(host, event, t, columns)

    def _finish_act(self, pending: "PendingAct") -> np.ndarray:
        if pending.event is not None:
            pending.event.synchronize()
        outputs = {k: v if isinstance(v, np.ndarray) else v.numpy() for k, v in pending.outputs.items()}
        for key, array in self.behaviour.items():
            array[pending.t, pending.columns] = outputs[key]
        return outputs["action"]

    def _tensor(self, obs: np.ndarray) -> torch.Tensor:
        """[B, ...] observations → [B, obs_dim] float32 on the policy's device."""
        return torch.as_tensor(obs).to(self.device, non_blocking=True).reshape(obs.shape[0], -1).float()

    def collect(self, steps: int) -> Chunk:
        """Load the newest weights handed over, then act `steps` (≤ chunk_steps) vector steps from where the last
        chunk ended. Returns the chunk: flat [steps * num_envs, ...] views of the step buffers, step-major, valid
        until the next collect()."""
        if self.first_step_at is None:
            self.first_step_at = time.time()
        with self.stages.timing("act"):
            self._refresh_policy()
        rows = self.buffers
        if self._carry_row is None:
            self.env.reset_into(rows)
        else:  # the last chunk's final obs is where this one starts
            rows.obs[0] = rows.obs[self._carry_row]
        if self.env.groups == 1:
            for t in range(steps):
                with self.stages.timing("act"):
                    rows.action[t] = self._act(rows.obs[t], t).reshape(rows.action[t].shape)
                self._step(rows, t)
        else:
            self._collect_overlapped(rows, steps)
        self._carry_row = steps
        # [steps, envs, ...] → [steps * envs, ...] (a view): the labelers and the buffer see flat transitions.
        chunk = {key: flat(getattr(rows, key)[:steps]) for key in (*STEPPED, *self.needs)}
        return chunk | {key: flat(array[:steps]) for key, array in self.behaviour.items()}

    def _collect_overlapped(self, rows: StepBuffers, steps: int) -> None:
        """Double buffering over the env's groups (Sample Factory's): the forward for the next group (the next step's
        first group after the last) is launched before this group steps, so on a GPU it runs while the CPU steps;
        with worker processes the step is begun first and the forward runs while the workers step. Row t of a
        group is acted on once that group's step t - 1 has ended; the transitions are those of groups=1 (same seeds)."""
        columns, order = self.env.columns, [(t, g) for t in range(steps) for g in range(self.env.groups)]
        with self.stages.timing("act"):
            pending = self._launch_act(rows.obs[0, columns[0]], 0, columns[0])
        for i, (t, g) in enumerate(order):
            with self.stages.timing("act"):
                rows.action[t, columns[g]] = self._finish_act(pending).reshape(rows.action[t, columns[g]].shape)
            if self.env.steps_elsewhere:
                self._timed_step(lambda: self.env.begin_step(rows, t, g))
            if i + 1 < len(order):
                next_t, h = order[i + 1]
                if self.env.stepping(h):  # its last step (at next_t - 1) has to end before it is acted on
                    self._end_group_step(h)
                with self.stages.timing("act"):
                    pending = self._launch_act(rows.obs[next_t, columns[h]], next_t, columns[h])
            if not self.env.steps_elsewhere:
                self._timed_step(lambda: self.env.begin_step(rows, t, g))
                self._end_group_step(g)
        for g in range(self.env.groups):
            if self.env.stepping(g):
                self._end_group_step(g)

    def _end_group_step(self, group: int) -> None:
        returns, lengths = self._timed_step(lambda: self.env.end_step(group))
        self._count_step(returns, lengths, self.env.columns[group].stop - self.env.columns[group].start)

    def _timed_step(self, work):
        """work() (stepping sub-envs); its time goes to "render" (the frames) and "step" (the rest)."""
        started, rendered_before = time.perf_counter(), self.env.render_s
        result = work()
        rendered = self.env.render_s - rendered_before
        self.stages.add("render", rendered)
        self.stages.add("step", time.perf_counter() - started - rendered)
        return result

    def _step(self, rows: StepBuffers, t: int) -> None:
        """One vector step into row t."""
        returns, lengths = self._timed_step(lambda: self.env.step_into(rows, t))
        self._count_step(returns, lengths, self.env.num_envs)

    def _count_step(self, returns: list[float], lengths: list[int], envs: int) -> None:
        self.finished_returns.extend(returns)
        self.finished_lengths.extend(lengths)
        self.env_steps += envs

    def run(self, max_env_steps: int, first_seq: int = 0, incarnation: int = 0, random_steps: int | None = None) -> dict:
        """Act until `max_env_steps` (this runner's share) or stop(); returns this runner's totals.
        `first_seq` keeps chunk ids of a resumed run or a restarted runner apart from those stored before;
        `incarnation` tags its chunks so the learner can count what each incarnation delivered; a restarted
        runner is told how many random steps it still owes (usually none: it acts with the learner's policy)."""
        if random_steps is not None:
            self.random_steps = random_steps
        # A budget lowered by set_budget before this call started (threaded actor: no order) still holds.
        self.max_env_steps = min(max_env_steps, self.max_env_steps)
        try:
            self._act_until_done(first_seq, incarnation)
        finally:
            self.close()  # the env's worker processes give their cores back
        return self.totals()

    def _act_until_done(self, seq: int, incarnation: int) -> None:
        num_envs = self.env.num_envs
        while self.env_steps < self.max_env_steps and not self._stop.is_set():
            with self.stages.timing("credit_wait"):
                if not self.credits.take(self._stop):
                    return
            # The last chunk is cut short so the run stops at its step budget, not a chunk later.
            steps = min(self.chunk_steps, -(-(self.max_env_steps - self.env_steps) // num_envs))
            if steps <= 0:  # the budget was lowered while waiting for a credit
                self.credits.give_back()
                return
            chunk = self.collect(steps)
            with self.stages.timing("send"):
                self._send(chunk, seq, incarnation)
            seq += 1

    def _send(self, chunk: Chunk, seq: int, incarnation: int) -> None:
        meta = ChunkMeta(runner=self.index, seq=seq, incarnation=incarnation, produced_at=time.time(),
                         policy_version=self.weights.version, size=len(chunk["obs"]), envs=self.env.num_envs)
        ref = ray.put(chunk)  # copies the chunk out of the step buffers: the next collect() may overwrite them
        self.credits.send(meta, ref, self.labelers)
        self.produced += meta["size"]
        self.chunks += 1

    def totals(self) -> dict:
        return {"runner": self.index, "env_steps": self.env_steps, "produced": self.produced, "chunks": self.chunks,
                "first_step_at": self.first_step_at}

    def stats(self) -> dict:
        returns, lengths = [], []
        while self.finished_returns:
            returns.append(self.finished_returns.popleft())
        while self.finished_lengths:
            lengths.append(self.finished_lengths.popleft())
        return {**self.totals(), "pid": os.getpid(), "episode_returns": returns, "episode_lengths": lengths,
                "stage_s": self.stages.snapshot(), "policy_version": self.weights.version,
                "in_flight": len(self.credits)}


@dataclass
class PendingAct:
    """A policy forward launched for sub-envs `columns` at step t: its outputs (host arrays, or pinned tensors being
    filled until `event` fires) — "action", and the behaviour fields when the runner records them."""

    outputs: dict
    event: "torch.cuda.Event | None"
    t: int
    columns: slice

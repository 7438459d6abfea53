"""VLA roles for GRPO (SimpleVLA-RL's recipe) and PPO on a simulator: a rollout worker and a learner.

`VLARolloutWorker` holds its envs (action-chunk wrapped) and the policy's instruction tokenizer; it builds a copy of the
policy on first use, unless an inference server samples its actions (`set_server`). Weights arrive by
`receive_weights(published)` (a runner role: the driver calls it before each rollout); `collect(seeds)` plays G episodes from each seed's initial state (a GRPO group: same seed, different action samples) and
returns what the learner needs: per policy call the observation, the sampled action tokens and their
log-probabilities at the rollout temperature (π_old), and per episode the binary success.

Pipelining (in-process threads, not separate Ray roles): the worker splits its envs into two groups and keeps
one env thread. While the env thread steps group A's envs, the worker's own thread runs policy inference for
group B, and the other way round, so the simulator and the policy overlap instead of waiting on each other.
`pipeline=False` runs the sequential loop (infer all, then step all) for comparison. The worker reports the
breakdown: env_s (time the env thread spent stepping), infer_s (time in inference), rollout_s (wall) and
overlap_s = env_s + infer_s − rollout_s (time both ran at once). On CPU both compete for the same cores and
for the GIL (SAPIEN's step and the numpy picture hold it), so the overlap here is modest; on a GPU machine
inference leaves the CPU free. The layout keeps inference in one place so that it can move into an engine
role that batches many workers (SEED-RL style) without changing the data the learner sees.

`VLALearner` turns episode successes into group advantages and runs the clipped token-level GRPO loss of
`rlfarm.algos.grpo` on every action token of the kept groups' policy calls (`rlfarm.algos.vla`). Its `stats` answer
from a thread of their own during an update, so the driver's deadline on an update is one on the learner's liveness.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import numpy as np
import ray
import torch

from rlfarm.algos.ppo_vla import PPOVLAConfig, update_ppo_vla
from rlfarm.algos.vla import VLAConfig, group_signal, update_vla
from rlfarm.envs.action_chunks import ActionChunkWrapper, ActionTokenizer
from rlfarm.envs.vla_tasks import instruction_vocabulary, make_vla_task
from rlfarm.models.lm import trainable_state_dict
from rlfarm.models.vla import (HFInstructionTokenizer, HFVLAActions, InstructionTokenizer, TinyVLA,
                               load_hf_vla_actions, tiny_vla)
from rlfarm.roles.base import role
from rlfarm.roles.common import assigned_device, limit_threads, save_atomic
from rlfarm.roles.stage_clock import StageClock
from rlfarm.sync.base import Publication
from rlfarm.sync.object_store import HeldWeights, ObjectStoreSender

BATCH_ARRAYS = ("image", "words", "proprio", "tokens", "logprobs", "called", "success", "steps")


class InferenceServerLost(RuntimeError):
    """A worker's inference server died during its rollout: the worker is fine, the rollout is lost (the driver
    waits for Ray to restart the server and has the worker play its seeds again)."""


def make_env(cfg: VLAConfig):
    return ActionChunkWrapper(make_vla_task(cfg.env_id, **cfg.env), cfg.chunk_size)


def policy_shapes(env) -> dict[str, int]:
    """What sizes the policy: the env's action and proprio dimensions and picture side."""
    inner = env.unwrapped
    return {"action_dim": int(inner.action_space.shape[0]),
            "proprio_dim": int(inner.observation_space["proprio"].shape[0]), "image_size": int(inner.image_size)}


def build_policy(cfg: VLAConfig, shapes: dict[str, int], value_head: bool | None = None) -> TinyVLA | HFVLAActions:
    """The tiny built-in VLA from `cfg.model`, or an HF checkpoint when `cfg.model` names a `source` folder.
    `value_head` (default: PPO with a shared trunk) adds V(observation) on the policy's own features; every copy of
    the policy (learner, workers, servers) has it, so published weights load everywhere by the same names."""
    torch.manual_seed(cfg.seed)
    if value_head is None:
        value_head = getattr(cfg, "critic", None) == "shared"
    if cfg.model.get("source"):
        return load_hf_vla_actions(str(cfg.model["source"]), shapes["action_dim"] * cfg.chunk_size, cfg.bins,
                                   lora=cfg.model.get("lora"), max_words=int(cfg.model.get("max_words", 16)),
                                   value_head=value_head)
    return tiny_vla(instruction_vocabulary(cfg.env_id), shapes["action_dim"], cfg.chunk_size, shapes["proprio_dim"],
                    image_size=shapes["image_size"], bins=cfg.bins, value_head=value_head, **cfg.model)


def load_trainable(policy, state: dict[str, torch.Tensor]) -> None:
    """The learner's published tensors into a rollout copy of the policy. The learner sends its trainable tensors only
    (the adapters, under LoRA); the rest is the same on both sides: the same checkpoint or the same seed built it."""
    unexpected = policy.load_state_dict(state, strict=False).unexpected_keys
    if unexpected:
        raise KeyError(f"rollout policy has no tensor {unexpected[0]!r} ({len(unexpected)} unknown names)")


def instruction_tokenizer(cfg: VLAConfig) -> InstructionTokenizer | HFInstructionTokenizer:
    """The tokenizer `build_policy(cfg, ...)`'s policy encodes instructions with, without building the policy."""
    if cfg.model.get("source"):
        from transformers import AutoTokenizer

        return HFInstructionTokenizer(AutoTokenizer.from_pretrained(str(cfg.model["source"])),
                                      int(cfg.model.get("max_words", 16)))
    return InstructionTokenizer(instruction_vocabulary(cfg.env_id), int(cfg.model.get("max_words", 12)))


def policy_inputs(tokenizer, images, instructions, proprios, device="cpu"):
    """Stacked observation fields → the three tensors the policy reads (`tokenizer`: the policy's instruction one)."""
    return (torch.as_tensor(np.stack(images), device=device),
            torch.as_tensor(tokenizer.encode(instructions), device=device),
            torch.as_tensor(np.stack(proprios), device=device))


@role("runner")
class VLARolloutWorker:
    def __init__(self, cfg: VLAConfig, groups: int, index: int = 0, threads: int = 1, device: str | None = None):
        """`device`: where inference runs; None takes the GPU Ray gave this worker, if any, else the CPU."""
        limit_threads(threads)
        self.cfg, self.index = cfg, index
        self.device = device or (assigned_device() if ray.is_initialized() else "cpu")
        self.envs = [make_env(cfg) for _ in range(groups * cfg.group_size)]
        self.policy_shapes = policy_shapes(self.envs[0])
        # The policy copy is built on first use: a worker whose calls go to an inference server never needs one (a
        # VLA-sized copy per worker would cost GPU memory and start-up); the instruction tokenizer is all it needs.
        self.policy: TinyVLA | HFVLAActions | None = None
        self.tokenizer = instruction_tokenizer(cfg)
        self.num_tokens = self.policy_shapes["action_dim"] * cfg.chunk_size
        space = self.envs[0].unwrapped.action_space
        self.action_tokenizer = ActionTokenizer(space.low, space.high, cfg.bins)  # actions are already [-1, 1]
        self.calls = -(-self.envs[0].unwrapped.max_steps // cfg.chunk_size)  # policy calls per episode, at most
        self.generator = torch.Generator(self.device).manual_seed(cfg.seed * 7919 + index)
        self.env_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="env-group")
        self.weights = HeldWeights()
        self.server = None  # set_server: a batching inference server samples the actions instead of self.policy
        # Read by stats() on the actor's watch thread while a rollout runs: when it last moved (None between
        # rollouts), whether it waits on its server now, and how many rollouts this incarnation finished.
        self._moved_at: float | None = None
        self._in_server_call = False
        self._rollouts = 0

    def shapes(self) -> dict[str, int]:
        return self.policy_shapes

    @ray.method(concurrency_group="watch")
    def stats(self) -> dict:
        """Which process this incarnation is (the driver tells a restarted worker by its pid) and, answered mid-
        rollout from the watch thread, how long the rollout in progress has not moved (a policy call or an env step
        is a move): the driver's deadline on a hung worker (`run.role_timeout_s`; a first rollout gets
        `run.restart_timeout_s`: it may build or compile a policy)."""
        moved_at = self._moved_at
        return {"pid": os.getpid(), "stalled_s": time.monotonic() - moved_at if moved_at is not None else 0.0,
                "in_server_call": self._in_server_call, "warm": self._rollouts > 0}

    def _moved(self) -> None:
        self._moved_at = time.monotonic()

    def receive_weights(self, published: Publication | None) -> int:
        """The learner's `publish` (None: keep the weights held); returns the version now held. Without a server the
        policy copy loads it if newer. With one, the driver has loaded it into the server first: the worker only
        holds its version, and an answer sampled with older weights means a restarted server that lost them."""
        if self.server is None:
            self.weights.load_newer(published, self._load_trainable)
        elif published is not None:
            self.weights.version = max(self.weights.version, published[1])
        return self.weights.version

    def _load_trainable(self, state: dict[str, torch.Tensor]) -> None:
        load_trainable(self._local_policy(), state)

    def _local_policy(self) -> TinyVLA | HFVLAActions:
        if self.policy is None:
            self.policy = build_policy(self.cfg, self.policy_shapes).to(self.device).eval()
        return self.policy

    def set_server(self, server) -> None:
        """Infer through this VLAInferenceServer (rlfarm/roles/vla_server.py) instead of the worker's own policy copy,
        which then only encodes instructions."""
        self.server = server

    def collect(self, seeds: list[int]) -> tuple[dict[str, Any], dict[str, float]]:
        """G episodes per seed, with the weights held (`receive_weights`). Returns (batch, stats): batch arrays are
        [N, C, ...] per policy call or [N] per episode (N = len(seeds) × G, C = calls per episode at most); stats hold
        the time breakdown."""
        self._versions: list[int] = []  # of the weights that sampled each call (the server's, when there is one)
        size = self.cfg.group_size
        if len(seeds) * size != len(self.envs):
            raise ValueError(f"{len(seeds)} seeds × {size} need {len(seeds) * size} envs, this worker has {len(self.envs)}")
        n, env0 = len(self.envs), self.envs[0].unwrapped
        # dict(obs) reads every field: a camera env that renders on first read (ManiSkillTask) renders here and in
        # _step_envs, so that pictures are always taken on one thread at a time and count as env time
        obs = [dict(env.reset(seed=int(seeds[i // size]))[0]) for i, env in enumerate(self.envs)]
        batch = {"image": np.zeros((n, self.calls, *env0.observation_space["image"].shape), np.uint8),
                 "words": np.zeros((n, self.calls, self.tokenizer.max_words), np.int64),
                 "proprio": np.zeros((n, self.calls, env0.observation_space["proprio"].shape[0]), np.float32),
                 "tokens": np.zeros((n, self.calls, self.num_tokens), np.int64),
                 "logprobs": np.zeros((n, self.calls, self.num_tokens), np.float32),
                 "called": np.zeros((n, self.calls), bool), "success": np.zeros(n, np.float32),
                 "steps": np.zeros(n, np.int64)}
        state = {"obs": obs, "active": np.ones(n, bool), "call": np.zeros(n, np.int64), "env_s": 0.0}
        halves = np.array_split(np.arange(n), 2) if self.cfg.pipeline and n > 1 else [np.arange(n)]
        started, infer_s, calls = time.perf_counter(), 0.0, 0
        pending: dict[int, Any] = {}
        self._moved()
        try:
            while state["active"].any():
                for group, members in enumerate(halves):
                    if group in pending:
                        pending.pop(group).result()  # this group's envs have stepped: its observations are fresh
                    live = members[state["active"][members]]
                    if not len(live):
                        continue
                    tick = time.perf_counter()
                    actions = self._infer(live, state, batch)
                    infer_s += time.perf_counter() - tick
                    calls += 1
                    pending[group] = self.env_thread.submit(self._step_envs, live, actions, state, batch)
        finally:  # no env step outlives its rollout, a failed one's either: the next rollout resets these envs
            wait(list(pending.values()))
            self._moved_at = None
            self._rollouts += 1
        for future in pending.values():
            future.result()
        rollout_s = time.perf_counter() - started
        env_steps = int(batch["steps"].sum())
        version = min(self._versions, default=self.weights.version)  # the oldest weights any call used
        stats = {"rollout_s": rollout_s, "env_s": state["env_s"], "infer_s": infer_s,
                 "overlap_s": max(0.0, state["env_s"] + infer_s - rollout_s), "inference_calls": calls,
                 "env_steps": env_steps, "episodes": n, "success_rate": float(batch["success"].mean()),
                 "policy_version": version, "pid": os.getpid(), "served": self.server is not None}
        return batch | {"version": version}, stats

    @torch.no_grad()
    def _infer(self, live: np.ndarray, state: dict, batch: dict) -> np.ndarray:
        """Sample action tokens for the live envs, record the call, return their action chunks [len(live), K, D]."""
        obs = [state["obs"][i] for i in live]
        inputs = policy_inputs(self.tokenizer, [o["image"] for o in obs], [o["instruction"] for o in obs],
                               [o["proprio"] for o in obs])  # on the host: recorded as they are, sent once
        if self.server is not None:  # the worker's thread waits here while its env thread steps the other group
            self._in_server_call = True
            try:
                tokens, logprobs, version = ray.get(self.server.sample.remote(*(t.numpy() for t in inputs)))
            except ray.exceptions.RayActorError as error:  # the server's death, not this worker's
                raise InferenceServerLost(f"its inference server died: {str(error).splitlines()[0]}") from None
            finally:
                self._in_server_call = False
            if version < self.weights.version:
                raise InferenceServerLost(f"its inference server sampled with weights v{version}, not "
                                          f"v{self.weights.version}: it was restarted and lost them")
            tokens, logprobs = torch.tensor(tokens), torch.tensor(logprobs)  # copies: Ray hands read-only arrays
        else:
            tokens, logprobs = self._local_policy().sample(*(t.to(self.device) for t in inputs), self.cfg.temperature,
                                                  self.generator)
            version = self.weights.version
        self._versions.append(version)
        call = state["call"][live]
        for name, value in zip(("image", "words", "proprio"), inputs):
            batch[name][live, call] = value.numpy()
        for name, value in (("tokens", tokens), ("logprobs", logprobs)):
            batch[name][live, call] = value.cpu().numpy()  # the sampled tokens: the one host sync per call
        batch["called"][live, call] = True
        state["call"][live] += 1
        self._moved()
        tokens = batch["tokens"][live, call].reshape(len(live), self.cfg.chunk_size, -1)
        return self.action_tokenizer.decode(tokens)

    def _step_envs(self, live: np.ndarray, actions: np.ndarray, state: dict, batch: dict) -> None:
        """Runs on the env thread: one chunk in each live env."""
        tick = time.perf_counter()
        for i, chunk in zip(live, actions):
            obs, _, terminated, truncated, info = self.envs[i].step(chunk)
            state["obs"][i] = dict(obs)
            batch["steps"][i] += info["steps"]
            batch["success"][i] = max(batch["success"][i], float(info["success"]))
            if terminated or truncated or state["call"][i] >= self.calls:
                state["active"][i] = False
            self._moved()
        state["env_s"] += time.perf_counter() - tick

    def close(self) -> None:
        self.env_thread.shutdown(wait=True)


def remote_worker_class():
    """VLARolloutWorker as a Ray actor class: `stats` answers from its own "watch" thread (concurrency group) while
    `collect` runs, so the driver tells a hung worker from a busy one; every other call keeps the one ordered thread."""
    return ray.remote(concurrency_groups={"watch": 1})(VLARolloutWorker)


def remote_learner_class():
    """VLALearner as a Ray actor class: `stats` answers from its own "watch" thread during an update, so the driver's
    wait on an update has a deadline on the learner's liveness (a stopped or hung process answers nothing)."""
    return ray.remote(concurrency_groups={"watch": 1})(VLALearner)


def merge_batches(batches: list[dict]) -> dict:
    return {name: np.concatenate([b[name] for b in batches]) for name in BATCH_ARRAYS} | \
        {"version": min(b["version"] for b in batches)}


@role("learner")
class VLALearner:
    def __init__(self, cfg: VLAConfig, shapes: dict[str, int] | None = None, threads: int = 1):
        """`shapes`: a worker's `shapes()`, so the learner need not build an env (a ManiSkill one starts a
        renderer and compiles shaders); None builds one to read them."""
        limit_threads(threads)
        self.cfg, self.device = cfg, assigned_device() if ray.is_initialized() else "cpu"
        shapes = shapes or policy_shapes(make_env(cfg))
        self.model = build_policy(cfg, shapes).to(self.device).eval()
        # PPO with critic=separate: a network of the policy's kind of its own, read only through its value head
        self.critic = (build_policy(cfg, shapes, value_head=True).to(self.device).eval()
                       if getattr(cfg, "critic", None) == "separate" else None)
        trained = [self.model] + ([self.critic] if self.critic is not None else [])
        self.optimizer = torch.optim.AdamW([p for net in trained for p in net.parameters() if p.requires_grad],
                                           lr=cfg.lr, weight_decay=0.0)  # under LoRA, only the adapters (+ value head)
        self.sender = ObjectStoreSender()  # counts the weight versions
        self.clock = StageClock("update", "publish")
        self.updates = 0

    @property
    def version(self) -> int:
        return self.sender.version

    @ray.method(concurrency_group="watch")
    def stats(self) -> dict:
        return {"pid": os.getpid(), "policy_version": self.version, "updates": self.updates,
                "stage_s": self.clock.snapshot()}

    def publish(self) -> Publication:
        """The trainable tensors (LoRA adapters only, under LoRA: a small part of an HF VLA), as CPU copies put once:
        `([ref], version)`."""
        return self.clock.timed("publish", self.sender.publish, trainable_state_dict(self.model))

    def update(self, *batches: dict) -> dict[str, float]:
        metrics = self.clock.timed("update", self._update, merge_batches(list(batches)))
        self.updates += 1
        return metrics

    def _update(self, batch: dict) -> dict[str, float]:
        valid = torch.as_tensor(batch["called"])
        metrics = {"success_rate": float(batch["success"].mean()),
                   "episode_steps": float(batch["steps"].mean()), "staleness": self.version - int(batch["version"]),
                   # −log π of the sampled tokens averages to the policy's entropy at the rollout temperature
                   "entropy": float(-torch.as_tensor(batch["logprobs"])[valid].mean())}
        if isinstance(self.cfg, PPOVLAConfig):
            return metrics | update_ppo_vla(self.model, self.critic, self.optimizer, batch, self.cfg, self.device)
        advantages, keep = group_signal(batch["success"], self.cfg)
        metrics["kept_groups"] = float(keep.float().mean())
        if keep.any():
            episodes = keep.repeat_interleave(self.cfg.group_size).nonzero(as_tuple=True)[0]
            metrics |= update_vla(self.model, self.optimizer, batch, advantages, episodes, self.cfg, self.device)
        return metrics

    def save(self, path: str, extra: dict | None = None) -> str:
        """Atomic checkpoint, loadable with torch.load(weights_only=True); `extra` is the driver's state."""
        critic = {"critic": self.critic.state_dict()} if self.critic is not None else {}
        return save_atomic({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), **critic,
                            "version": self.version, "torch_rng": torch.get_rng_state(), "extra": extra or {}}, path)

    def load(self, path: str) -> dict:
        """Restore a checkpoint written by `save`; returns its `extra`."""
        state = torch.load(path, map_location=self.device, weights_only=True)
        self.model.load_state_dict(state["model"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.sender.version = int(state["version"])
        torch.set_rng_state(state["torch_rng"].cpu())
        return dict(state["extra"])

"""On-policy roles for LLM policies: an Engine role generates, a Scorer (the labeler of this family) turns
completions into rewards, and a LMLearner updates and publishes weights. Each wraps pure stages:
`rlfarm.rewards.rollouts.score_rollout` and `rlfarm.algos.grpo_lm` (and a `ValueCritic` under algo=ppo_lm).

Weights reach the engine through one transport, picked once at start (`rlfarm.sync.transport`): the object
store (CPU copies, what CPU roles use), a broadcast over a process group of the learner and the engine (NCCL
between GPUs: the tensors never touch the host), or CUDA IPC when both share one GPU (the engine copies from
the learner's GPU buffers). The driver opens it (`LMLearner.open_sync`, then `LMLearner.join_sync`
and `EngineRole.open_sync` at the same time); every sync after that is `LMLearner.publish` →
`EngineRole.receive_weights`, whatever the transport. Several engines split each step (`EngineRole` shard): rank 0
sends to all of them in one go (one broadcast group, or the same host copies); under CUDA IPC each engine reads
from the learner rank on its own GPU (`rlfarm.loops.llm_layout.plan_weight_sync`).

The learner may be N data-parallel LMLearner actors (`rlfarm.loops.learner_group`), each training on its shard
(DDP/FSDP, `rlfarm.data_parallel`); rank 0 publishes (under DDP with IPC, every rank on an engine's GPU) and
reports, with the update's model-FLOPs utilization (`rlfarm.algos.model_flops`). Precision: GPU roles compute in
`dtype` (the engine's weights, the learner's autocast and what it publishes; its weights and AdamW stay fp32);
CPU roles run float32 (`rlfarm.models.lm.compute_dtype`).

The policy is built from a config dict (vocabulary: the digit tokenizer's, or its shape's) or loaded from a hub id
/ folder (`model.source`), whose tokenizer the task then speaks (`rlfarm.envs.text_tasks.TextTaskSpec`)."""
from __future__ import annotations

import copy
import os
import time
from dataclasses import replace

import numpy as np
import ray
import torch

from rlfarm.algos.grpo import group_advantages
from rlfarm.algos.grpo_lm import GRPOConfig, policy_optimizer, rollout_metrics, update_policy
from rlfarm.algos.model_flops import UpdateFigures
from rlfarm.algos.versions import version_metrics
from rlfarm.memory_plan import measured_peak_gib
from rlfarm.data import Rollout, concat_rollouts
from rlfarm.data_parallel import is_sharded, join_data_parallel, shard_model, wrap_data_parallel
from rlfarm.engines.base import load_into
from rlfarm.engines.hf import HFEngine
from rlfarm.engines.sampling import Rows
from rlfarm.engines.streams import engine_streams, restore_torch_streams, set_engine_streams, torch_streams
from rlfarm.envs.text_tasks import DigitTokenizer, TextTaskSpec, text_task, text_tokenizer
from rlfarm.models.lm import causal_lm, compute_dtype, trainable_state_dict
from rlfarm.rewards.rollouts import score_rollout
from rlfarm.rewards.verifiers import get_verifier
from rlfarm.roles.base import role
from rlfarm.roles.gathered_weights import GatheredWeights
from rlfarm.roles.common import (assigned_device, limit_threads, release_cached_memory, save_atomic,
                                 serve_rendezvous_here)
from rlfarm.roles.stage_clock import StageClock
from rlfarm.roles.value_critic import ValueCritic
from rlfarm.sync import HostSender, PassThroughReceiver, WeightReceiver, WeightSender
from rlfarm.sync.transport import SenderSetup, open_receiver


def _policy(cfg: GRPOConfig, lora: bool = True, device: str = "cpu") -> torch.nn.Module:
    """Learner and engine build the same policy (the same seed makes the same LoRA adapters), in float32; lora=False:
    the same weights without adapters (the PPO critic's start). Vocabulary: `cfg.vocab_size` or the digit task's.
    Built on `device` if a GPU (a 7B shape's random init takes minutes on a CPU thread): learner and engines are
    on GPUs alike or on CPUs alike in every layout, so the same seed still gives them the same weights."""
    torch.manual_seed(cfg.seed)
    source = cfg.model if isinstance(cfg.model, str) else {  # model.source: a pretrained model, its own config
        **cfg.model, "vocab_size": cfg.vocab_size or DigitTokenizer().vocab_size}
    with torch.device(device if torch.device(device).type == "cuda" and not isinstance(source, str) else "cpu"):
        return causal_lm(source, lora=cfg.lora if lora else None, recompute=cfg.activation_checkpointing)


def gpu_location() -> tuple[str, int]:
    """(node id, the GPU Ray gave this actor, or -1): roles with equal locations share one GPU."""
    gpu_ids = ray.get_gpu_ids()
    return ray.get_runtime_context().get_node_id(), int(gpu_ids[0]) if gpu_ids else -1


def _task_spec(cfg: GRPOConfig, task: TextTaskSpec | None) -> TextTaskSpec:
    """The task as given, or the digit task of `cfg` in the policy's tokenizer (its source, if loaded)."""
    if task is not None:
        return task
    return TextTaskSpec(cfg.task, cfg.num_digits, tokenizer=cfg.model if isinstance(cfg.model, str) else None,
                        seed=cfg.seed)


def watch(method):
    """`stats` of a role started with a "watch" concurrency group (`rlfarm.loops.deadlines.WATCH`): it answers
    while a generate, score or update runs, so the driver's deadline is on liveness, not on the work."""
    return ray.method(concurrency_group="watch")(method)


@role("engine")
class EngineRole:
    """Holds the prompt stream and an engine; `generate` returns (rollout, answers) for one round.
    task: what to prompt with (None: the digit task of `cfg`).
    shard = (index, count): this engine's share of a step split across `count` engines (data-parallel
    rollout): every engine draws the step's prompts from the same stream and generates prompts
    index·P/count … (index+1)·P/count − 1 of them; its samples' noise is keyed by their index in the step (`Rows`,
    `rlfarm.engines.noise`). From the same seed the engines' parts of every step, joined in index order, are what
    one engine generates (as far as the arithmetic of different batch sizes allows).
    engine: `HFEngine` options (synthetic_lengths: a speed-run setting). Partial rollouts: `receive_weights` sent
    in the "sync" concurrency group runs beside a generation and enters it between decode steps (`HFEngine.gate`)."""

    def __init__(self, cfg: GRPOConfig, threads: int = 1, dtype: str = "float32", task: TextTaskSpec | None = None,
                 shard: tuple[int, int] = (0, 1), engine: dict | None = None):
        limit_threads(threads)
        self.cfg = cfg
        self.index, self.count = shard
        if cfg.prompts_per_step % self.count:
            raise ValueError(f"{cfg.prompts_per_step} prompts per step do not split across {self.count} engines")
        self.spec = _task_spec(cfg, task)
        self.task = text_task(self.spec)
        device = assigned_device()
        policy = _policy(cfg, device=device).to(compute_dtype(dtype, device))
        self.engine = HFEngine(policy, pad_id=self.task.tokenizer.pad_id, device=device, seed=cfg.seed,
                               **(engine or {}))
        self.max_new_tokens = cfg.max_new_tokens or self.task.max_new_tokens
        self.receiver: WeightReceiver = PassThroughReceiver()  # the object store, until `open_sync` picks another
        self.stages = StageClock("generate", "receive")

    @watch
    def stats(self) -> dict:
        return {"pid": os.getpid(), "stage_s": self.stages.snapshot(), "policy_version": self.engine.weight_version}

    def generate(self, min_version: int = 0, timeout_s: float = 600.0) -> tuple[Rollout, list[str]]:
        """min_version: start from weights of at least this version (a receive may run beside the queued calls)."""
        self.engine.wait_for_weights(min_version, timeout_s)
        prompts = self.task.sample(self.cfg.prompts_per_step)  # the whole step's: one stream for all engines
        share, group = self.cfg.prompts_per_step // self.count, self.cfg.group_size
        first = self.index * share
        rollout = self.engine.generate(prompts.prompt_ids[first:first + share], group, self.max_new_tokens,
                                       self.cfg.temperature, self.cfg.top_p, eos_id=self.task.tokenizer.stop_ids,
                                       rows=Rows(first * group, self.cfg.prompts_per_step * group))
        return rollout, prompts.answers[first:first + share]

    def generate_with_stats(self, min_version: int = 0, timeout_s: float = 600.0
                            ) -> tuple[tuple[Rollout, list[str]], dict]:
        """`generate`, and what the driver reads without fetching the rollout (call with num_returns=2): {"generate_s",
        "tokens", "policy_version" (the learner's, of the weights used), "streams" (after it, for a checkpoint),
        "peak_gib" (its peak CUDA memory in it), "capture_s", "graphs_captured", "eager_steps" (its graphs)}."""
        started = time.perf_counter()
        with self.stages.timing("generate"):
            generated = self.generate(min_version, timeout_s)
        rollout = generated[0]
        call = getattr(self.engine, "last_call", None)  # the built-in engine's (None: HF cache path, vLLM)
        return generated, {"generate_s": time.perf_counter() - started, "tokens": int(rollout.response_mask.sum()),
                           "policy_version": rollout.weight_version, "streams": engine_streams(self.task, self.engine),
                           "peak_gib": measured_peak_gib(str(self.engine.device)),  # this generation's (None: CPU)
                           **(call.capture_stats() if call else {})}

    def reseed(self, streams: int | dict) -> None:
        """New prompt and sampling streams from a seed (a restarted engine), or, resuming, both continued from the
        "streams" a step's `generate_with_stats` returned (`rlfarm.engines.streams`)."""
        set_engine_streams(self.task, self.engine, streams)

    def device(self) -> str:
        return str(self.engine.device)

    def location(self) -> tuple[str, int]:
        return gpu_location()

    def open_sync(self, transport: str, address: str | None = None, rank: int = 1, world_size: int = 2) -> None:
        """Build this engine's receiver for `transport`, once (a broadcast: join the learner's group, at the same
        time as the learner's `join_sync`). address: what the learner's `open_sync` returned."""
        self.receiver = open_receiver(transport, self.engine.device, address, rank, world_size)

    def receive_weights(self, published: list) -> int:
        """Load what the learner's `publish` sends; returns its version. published = [the ref of its result], boxed
        so that Ray starts this call without waiting for the learner: over a collective the learner's `publish`
        returns only once this call has received the tensors, so its result (no payload; the version) is read
        after them. Other transports' payload (the tensors' host copies, the IPC handles) is read first."""
        started = time.perf_counter()  # added, not `timing`: with partial rollouts it overlaps a generation
        try:
            return self._receive(published)
        finally:
            self.stages.add("receive", time.perf_counter() - started)

    def _receive(self, box: list) -> int:  # the weights go in between decode steps of a generation in flight
        if self.receiver.meets_sender:
            with self.engine.gate.swapping():
                load_into(self.engine, self.receiver, None, self.engine.weight_version)
                _, version = ray.get(box[0])
                self.engine.weight_version = version
        else:
            sent, version = ray.get(box[0])
            with self.engine.gate.swapping():
                load_into(self.engine, self.receiver, sent, version)
        return version

    def sleep(self) -> None:
        """Colocated: give the GPU memory (weights, KV cache) back while the learner updates. The loop syncs
        right after `wake`, and that sync rewrites every trainable tensor: those are dropped, not offloaded."""
        self.engine.sleep(discard=trainable_state_dict(self.engine.model).keys())

    def wake(self) -> None:
        self.engine.wake()


@role("labeler")
class TextLabeler:
    """The labeler of the on-policy family: a rule verifier over decoded completions (an HF tokenizer decodes
    without special tokens, so the verifier reads only the answer text)."""

    def __init__(self, cfg: GRPOConfig, task: TextTaskSpec | None = None):
        self.tokenizer = text_tokenizer(_task_spec(cfg, task))
        self.verifier = get_verifier(cfg.verifier)
        self.stages = StageClock("score")

    @watch
    def stats(self) -> dict:
        return {"pid": os.getpid(), "stage_s": self.stages.snapshot()}

    def score(self, generated: tuple[Rollout, list[str]]) -> np.ndarray:
        rollout, answers = generated
        return score_rollout(rollout, answers, self.tokenizer, self.verifier, self.tokenizer.stop_ids)

    def score_with_stats(self, generated: tuple[Rollout, list[str]]) -> tuple[np.ndarray, dict]:
        """`score`, and its time {"score_s"} (call with num_returns=2)."""
        started = time.perf_counter()
        with self.stages.timing("score"):
            rewards = self.score(generated)
        return rewards, {"score_s": time.perf_counter() - started}


@role("learner")
class LMLearner:
    """Updates the policy on a rollout and its rewards — advantages from the groups' rewards (GRPO) or from a
    `ValueCritic` (algo.advantage=gae, `critic`) — and publishes the trainable weights (adapters only under LoRA).

    rank / world_size: this actor's place among the learner's data-parallel ranks. With world_size > 1 the
    ranks join one process group (`open_data_parallel` on rank 0, then `join_data_parallel` on all) before
    the first update; every rank then takes the same `update` call and trains on its shard.
    Rank 0 sends the weights to the engines through `sender`, built once for the transport the driver picked
    (`open_sync`, `join_sync`); `publish` sends each new version."""

    def __init__(self, cfg: GRPOConfig, threads: int = 1, dtype: str = "float32", rank: int = 0, world_size: int = 1):
        limit_threads(threads)
        self.cfg = replace(cfg, device=assigned_device())
        self.rank, self.world_size = rank, world_size
        self.compute_dtype = compute_dtype(dtype, self.cfg.device)
        # fp32 weights (autocast computes in bf16); built on a GPU, a loaded model moved there
        self.model = _policy(cfg, device=self.cfg.device).to(self.cfg.device).eval()
        self.trainer = self.model  # what the update runs: the DDP wrapper (or the sharded model) once the ranks joined
        self.optimizer = self._optimizer()
        self.ref_model = copy.deepcopy(self.model).requires_grad_(False) if cfg.kl_coef else None
        self.critic: ValueCritic | None = None
        if cfg.advantage == "gae":  # PPO: a critic of the policy's architecture and starting weights
            self.critic = ValueCritic(_policy(cfg, lora=False), self.cfg, self.compute_dtype)
        self.version = 0
        self.sender: WeightSender = HostSender()  # the object store, until `join_sync` builds another
        self._sync: SenderSetup | None = None  # open_sync's half of the handshake
        self.gathered = GatheredWeights(rank, self.compute_dtype)  # under FSDP, rank 0: what it publishes
        self.publish_s, self.updates = 0.0, 0  # publish_s: the last `publish`'s time, sent with the next update
        self.figures = UpdateFigures(self.model, self.cfg.device, world_size)  # learner_tflops, mfu, peak GiB
        self.stages = StageClock("update", "publish")

    @watch
    def stats(self) -> dict:
        return {"pid": os.getpid(), "stage_s": self.stages.snapshot(), "updates": self.updates,
                "policy_version": self.version}

    def _optimizer(self) -> torch.optim.Optimizer:
        return policy_optimizer(self.model, self.cfg.lr, self.cfg.device)

    def _published(self) -> dict[str, torch.Tensor]:
        """The trainable tensors in the engine's dtype (half the bytes to move under bf16). Under FSDP the
        ranks gathered them together after the update (`GatheredWeights`): only rank 0 publishes, alone."""
        if is_sharded(self.model):
            return self.gathered.tensors
        return {name: t.to(self.compute_dtype) for name, t in trainable_state_dict(self.model).items()}

    def open_sync(self, transport: str, engines: int = 1) -> str | None:
        """A publishing rank (rank 0; under IPC each rank sharing an engine's GPU), once: start the weight sync to
        `engines` engines by `transport`. Returns the address they join (`EngineRole.open_sync`) when the
        transport is a process group (None otherwise)."""
        if self.rank and is_sharded(self.model):  # it keeps no gathered tensors (`GatheredWeights`)
            raise ValueError("under FSDP only learner rank 0 publishes weights")
        self._sync = SenderSetup(transport, engines)
        return self._sync.address

    def join_sync(self) -> None:
        """Build the sender, once, while the engines run their `open_sync` (a broadcast: all join the group)."""
        self.sender = self._sync.open(self._published(), self.cfg.device)
        self.gathered.adopt(self.sender)  # under FSDP with IPC: gather straight into the sender's shared buffers

    def publish(self) -> tuple[object, int]:
        """Send the trainable tensors to the engines; returns (what each engine's `receive` reads: the host
        copies, the IPC handles, or None over a broadcast, version). Over a broadcast this returns only once
        the engines have received."""
        started = time.perf_counter()
        self.version += 1
        with self.stages.timing("publish"):
            sent = self.sender.send(self._published())
        self.publish_s = time.perf_counter() - started
        return sent, self.version

    def weight_version(self) -> int:
        """The version of the weights published last (the next `publish` sends version + 1)."""
        return self.version

    def location(self) -> tuple[str, int]:
        return gpu_location()

    def open_data_parallel(self) -> str:
        """Rank 0: serve the data-parallel group's rendezvous on a free port; returns the address the others join."""
        self._dp_rendezvous, address = serve_rendezvous_here(self.world_size)
        return address

    def join_data_parallel(self, address: str) -> int:
        """Join the group (all ranks at once) and wrap the model in DDP; returns the GPU id Ray gave this rank
        (-1 on CPU), so the caller can check the ranks hold different GPUs."""
        join_data_parallel(self._dp_rendezvous if self.rank == 0 else address, self.rank, self.world_size,
                           self.cfg.device)
        if self.cfg.data_parallel == "fsdp":
            self.trainer = shard_model(self.model, self.compute_dtype)  # in place: the parameters become shards
            self.optimizer = self._optimizer()      # over the shards
            self.gathered.gather(self.model)
        else:
            self.trainer = wrap_data_parallel(self.model, self.cfg.device)
        gpu_ids = ray.get_gpu_ids()
        return int(gpu_ids[0]) if gpu_ids else -1

    def device(self) -> str:
        return str(self.cfg.device)

    def update_gathered(self, generated: list, rewards: list) -> dict:
        """One update on a step that several engines generated: `generated` and `rewards` hold each engine's
        part (object refs, boxed so they are fetched here, in engine order); joined, they are the step.
        Adds the update's own time and the last publish's."""
        started = time.perf_counter()
        with self.stages.timing("update"):
            metrics = self.update_parts(ray.get(list(generated)), ray.get(list(rewards)))
        self.updates += 1
        release_cached_memory()  # the update's activations' blocks: a colocated engine wakes next
        seconds, tokens = time.perf_counter() - started, metrics.pop("trained_tokens", 0)
        return metrics | {"update_s": seconds, "publish_s": self.publish_s} | self.figures.of(tokens, seconds)

    def update_parts(self, parts: list[tuple[Rollout, list[str]]], rewards: list[np.ndarray]) -> dict:
        """One update on the engines' parts of a step, joined in order."""
        rollout = concat_rollouts([part[0] for part in parts])
        answers = [answer for part in parts for answer in part[1]]
        return self.update((rollout, answers), np.concatenate(rewards))

    def update(self, generated: tuple[Rollout, list[str]], rewards: np.ndarray) -> dict:
        rollout, _ = generated
        rewards = np.array(rewards)  # the object store hands out read-only arrays
        staleness = version_metrics(rollout, self.version)  # staleness, partial_ratio, version spans
        if self.critic is not None:  # PPO: every sample counts, advantages per token from the critic
            every = torch.ones(len(rewards) // self.cfg.group_size, dtype=torch.bool)
            targets = self.critic.targets(rollout, rewards)
            metrics = rollout_metrics(rollout, rewards, every) | staleness
            return metrics | self._update_policy(rollout, targets.advantages) | self.critic.fit(targets)
        advantages, keep = group_advantages(rewards, self.cfg.group_size, self.cfg.norm_std, self.cfg.filter_groups)
        metrics = rollout_metrics(rollout, rewards, keep) | staleness
        if keep.any():  # every rank sees the same rewards, so all ranks take this branch or none
            kept, kept_advantages = rollout.select_groups(keep), advantages[keep.repeat_interleave(self.cfg.group_size)]
            metrics |= self._update_policy(kept, kept_advantages)
        return metrics

    def _update_policy(self, rollout: Rollout, advantages: torch.Tensor) -> dict[str, float]:
        """The clipped policy steps, on every rank at once; advantages: per sample [B] or per token [B, T]."""
        # self.trainer: the DDP-wrapped or FSDP-sharded model on > 1 ranks, the model itself on one
        metrics = update_policy(self.trainer, self.optimizer, rollout, advantages, self.cfg, self.ref_model,
                                rank=self.rank, world_size=self.world_size, compute_dtype=self.compute_dtype)
        metrics["trained_tokens"] = int(rollout.attention_mask().sum())  # the step's, all ranks': for its MFU
        if is_sharded(self.model):
            self.gathered.gather(self.model)
        return metrics

    def save(self, path: str, extra: dict | None = None) -> str:
        """Every rank takes this call (`LearnerGroup.save`); rank 0 writes whole tensors, atomically (under FSDP
        the ranks gather them together first: model and AdamW state, as one learner's checkpoint would hold), and
        the critic's state under gae. `extra`: the driver's counters. Loadable with torch.load(weights_only=True)."""
        if is_sharded(self.model):
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
            model, optimizer = get_state_dict(self.model, self.optimizer,
                                              options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        elif self.rank == 0:
            model, optimizer = self.model.state_dict(), self.optimizer.state_dict()
        if self.rank == 0:
            critic = {} if self.critic is None else {"critic": self.critic.state_dict()}
            save_atomic({"model": model, "optimizer": optimizer, "version": self.version, "extra": extra or {},
                         "rng": torch_streams(self.cfg.device), **critic}, path)
        return path

    def load(self, path: str) -> dict:
        """Every rank restores the checkpoint `save` wrote (under FSDP each keeps its shards of it); returns
        its `extra`. The KL reference stays the initial policy this learner was built as."""
        state = torch.load(path, map_location="cpu", weights_only=True)
        if is_sharded(self.model):
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optimizer"], options=StateDictOptions(full_state_dict=True))
            self.gathered.gather(self.model)
        else:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
        self.version = int(state["version"])
        restore_torch_streams(state.get("rng"), self.cfg.device)  # the minibatch permutation continues
        return dict(state["extra"])

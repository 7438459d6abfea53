"""On-policy roles for LLM policies: an Engine role generates, a Scorer (the labeler of this family) turns
completions into rewards, and a PolicyLearner updates and publishes weights. Each wraps the pure stages of
`rlfarm.algos.grpo_trainer`, so the single-process reference trainer and the Ray loop run the same code.

Weights reach the engine one of three ways (`rlfarm.sync`): through the object store (`publish` →
`update_weights`: CPU copies, what CPU roles use); by broadcast over a process group of the learner and
the engine (`open_weight_sync` / `join_weight_sync`, then `broadcast_weights` → `receive_weights`: NCCL
between GPUs, the tensors never touch the host); or, colocated on one GPU, through CUDA IPC (`publish_shared`
→ `load_shared`: the engine copies from the learner's GPU buffers).

The learner may be N data-parallel PolicyLearner actors (`rlfarm.roles.learner_group`): each trains on its shard
of the batch under DDP (`rlfarm.distributed`), and rank 0 alone publishes weights and reports.
Precision: `dtype` ("bfloat16") is what the GPU roles compute in — the engine holds its weights in it, the
learner keeps fp32 weights and optimizer and runs its forward passes under autocast to it, and publishes
weights cast to it; on CPU every role runs float32 (`rlfarm.models.lm.compute_dtype`).

The policy is built from a config dict (`cfg.model`: a mapping; vocabulary = the digit tokenizer's) or loaded
from a hub id / folder (`cfg.model`: a string, `model.source`), whose own tokenizer the task then speaks
(`rlfarm.envs.text_tasks.TextTaskSpec`: digit tasks or a prompt file)."""
from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import ray
import torch

from rlfarm.algos.grpo_trainer import GRPOConfig, group_advantages, rollout_metrics, score_rollout, update_policy
from rlfarm.algos.ppo_lm_trainer import update_actor_critic
from rlfarm.distributed import full_tensors, is_sharded, join_data_parallel, shard_model, wrap_data_parallel
from rlfarm.engines.base import Rollout
from rlfarm.engines.hf import HFEngine
from rlfarm.envs.text_tasks import DigitTokenizer, TextTaskSpec, text_task, text_tokenizer
from rlfarm.models.critic import TokenCritic
from rlfarm.models.lm import causal_lm, compute_dtype, trainable_state_dict
from rlfarm.rewards.verifiers import get_verifier
from rlfarm.roles.common import assigned_device, limit_threads, save_atomic
from rlfarm.sync import (BroadcastReceiver, BroadcastSender, HostSender, IpcPayload, IpcReceiver, IpcSender,
                         join_group, load_into, plan_layout, serve_rendezvous)

SYNC_BUCKET_BYTES = 256 * 2**20  # broadcast buckets: 4 for the 0.5B shape in bf16 (H200: 64 MB 2.1x a raw copy, 256 MB 1.2-1.6x)


def _policy(cfg: GRPOConfig, lora: bool = True) -> torch.nn.Module:
    """Learner and engine build the same policy (the same seed makes the same LoRA adapters), in float32;
    lora=False: the same weights without adapters (the PPO critic's starting point)."""
    torch.manual_seed(cfg.seed)
    adapters = cfg.lora if lora else None
    if isinstance(cfg.model, str):  # model.source: a pretrained model, sized by its own config
        return causal_lm(cfg.model, lora=adapters)
    return causal_lm({**cfg.model, "vocab_size": DigitTokenizer().vocab_size}, lora=adapters)


def _task_spec(cfg: GRPOConfig, task: TextTaskSpec | None) -> TextTaskSpec:
    """The task as given, or the digit task of `cfg` in the policy's tokenizer (its source, if loaded)."""
    if task is not None:
        return task
    return TextTaskSpec(cfg.task, cfg.num_digits, tokenizer=cfg.model if isinstance(cfg.model, str) else None,
                        seed=cfg.seed)


class EngineRole:
    """Holds the prompt stream and an engine; `generate` returns (rollout, answers) for one round.
    task: what to prompt with (None: the digit task of `cfg`)."""

    def __init__(self, cfg: GRPOConfig, threads: int = 1, dtype: str = "float32", task: TextTaskSpec | None = None):
        limit_threads(threads)
        self.cfg = cfg
        self.spec = _task_spec(cfg, task)
        self.task = text_task(self.spec)
        device = assigned_device()
        policy = _policy(cfg).to(compute_dtype(dtype, device))
        self.engine = HFEngine(policy, pad_id=self.task.tokenizer.pad_id, device=device, seed=cfg.seed)
        self.max_new_tokens = cfg.max_new_tokens or self.task.max_new_tokens
        self._shared: IpcReceiver | None = None  # CUDA IPC weight sync, mapped on first use

    def generate(self) -> tuple[Rollout, list[str]]:
        prompts = self.task.sample(self.cfg.prompts_per_step)
        rollout = self.engine.generate(prompts.prompt_ids, self.cfg.group_size, self.max_new_tokens,
                                       self.cfg.temperature, self.cfg.top_p, eos_id=self.task.tokenizer.stop_ids)
        return rollout, prompts.answers

    def reseed(self, seed: int) -> None:
        """A resumed run: new prompt and sampling streams, so it does not replay the first run's prompts."""
        self.task = text_task(replace(self.spec, seed=seed))
        self.engine.reseed(seed)

    def update_weights(self, box: list, version: int) -> int:
        """`box` = [ref] so Ray hands over the ref, and the weights are fetched here, once."""
        self.engine.update_weights(ray.get(box[0]), version)
        return version

    def device(self) -> str:
        return str(self.engine.device)

    def join_weight_sync(self, address: str, rank: int, world_size: int) -> None:
        """Join the learner's sync group (called while the learner joins it too)."""
        self._receiver = BroadcastReceiver(join_group(address, rank, world_size, self.engine.device))

    def receive_weights(self, box: list) -> int:
        """Load what the learner's `broadcast_weights` is sending; `box` = [ref of its version], read after
        the tensors arrived (a ref passed bare would make Ray wait for the learner before this call starts)."""
        load_into(self.engine, self._receiver, None, self.engine.weight_version)
        self.engine.weight_version = int(ray.get(box[0]))
        return self.engine.weight_version

    def load_shared(self, payload: IpcPayload, version: int) -> int:
        """Colocated on one GPU: copy the weights out of the learner's buffers (`PolicyLearner.publish_shared`)."""
        if self._shared is None:
            self._shared = IpcReceiver(self.engine.device)
        load_into(self.engine, self._shared, payload, version)
        return version

    def sleep(self) -> None:
        """Colocated: give the GPU memory (weights, KV cache) back while the learner updates. The loop syncs
        right after `wake`, and that sync rewrites every trainable tensor: those are dropped, not offloaded."""
        self.engine.sleep(discard=trainable_state_dict(self.engine.model).keys())

    def wake(self) -> None:
        self.engine.wake()


class ScorerRole:
    """The labeler of the on-policy family: a rule verifier over decoded completions (an HF tokenizer decodes
    without special tokens, so the verifier reads only the answer text)."""

    def __init__(self, cfg: GRPOConfig, task: TextTaskSpec | None = None):
        self.tokenizer = text_tokenizer(_task_spec(cfg, task))
        self.verifier = get_verifier(cfg.verifier)

    def score(self, generated: tuple[Rollout, list[str]]) -> np.ndarray:
        rollout, answers = generated
        return score_rollout(rollout, answers, self.tokenizer, self.verifier, self.tokenizer.stop_ids)


class PolicyLearner:
    """GRPO update on a rollout and its rewards; publishes the trainable weights (adapters only under LoRA).

    rank / world_size: this actor's place among the learner's data-parallel ranks. With world_size > 1 the
    ranks join one process group (`open_data_parallel` on rank 0, then `join_data_parallel` on all) before
    the first update; every rank then takes the same `update` call and trains on its shard."""

    def __init__(self, cfg: GRPOConfig, threads: int = 1, dtype: str = "float32", rank: int = 0,
                 world_size: int = 1):
        limit_threads(threads)
        self.cfg = replace(cfg, device=assigned_device())
        self.rank, self.world_size = rank, world_size
        self.compute_dtype = compute_dtype(dtype, self.cfg.device)
        self.model = _policy(cfg).to(self.cfg.device).eval()  # fp32 weights: autocast computes in bf16
        self.trainer = self.model  # what the update runs: the DDP wrapper (or the sharded model) once the ranks joined
        self.optimizer = self._optimizer()
        self.ref_model = copy.deepcopy(self.model).requires_grad_(False) if cfg.kl_coef else None
        self.critic = self.critic_optimizer = None
        if cfg.advantage == "gae":  # PPO: a critic of the policy's architecture and starting weights
            self.critic = TokenCritic(_policy(cfg, lora=False)).to(self.cfg.device).eval()
            self.critic_optimizer = torch.optim.AdamW(self.critic.parameters(), lr=cfg.critic_lr, weight_decay=0.0)
        self.version = 0
        self._shared: IpcSender | None = None
        self._gathered: dict[str, torch.Tensor] = {}  # under FSDP, rank 0: the whole trainable tensors

    def _optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=self.cfg.lr,
                                 weight_decay=0.0)

    def _published(self) -> dict[str, torch.Tensor]:
        """The trainable tensors in the engine's dtype (half the bytes to move under bf16). Under FSDP the
        ranks gathered them together after the update (`_gather`): only rank 0 publishes, alone."""
        if is_sharded(self.model):
            return self._gathered
        return {name: t.to(self.compute_dtype) for name, t in trainable_state_dict(self.model).items()}

    def _gather(self) -> None:
        """FSDP, every rank at once: all-gather the trainable shards; rank 0 keeps them (in the engine's dtype)
        for the next publish, the others drop them. One tensor at a time, so a rank holds one extra at most."""
        gathered = {}
        for name, shard in trainable_state_dict(self.model).items():
            whole = full_tensors({name: shard})[name]
            if self.rank == 0:
                gathered[name] = whole.to(self.compute_dtype)
        self._gathered = gathered

    def publish(self) -> tuple[list, int]:
        self.version += 1
        return [ray.put(HostSender().send(self._published()))], self.version

    def publish_shared(self) -> tuple[IpcPayload, int]:
        """Colocated on one GPU: pack the weights into buffers the engine maps through CUDA IPC (allocated once)."""
        published = self._published()
        if self._shared is None:
            self._shared = IpcSender(published, self.cfg.device)
        self.version += 1
        return self._shared.send(published), self.version

    def open_data_parallel(self) -> str:
        """Rank 0: serve the data-parallel group's rendezvous on a free port; returns the address the others join."""
        self._dp_rendezvous = serve_rendezvous(self.world_size, host=ray.util.get_node_ip_address())
        return f"{ray.util.get_node_ip_address()}:{self._dp_rendezvous.port}"

    def join_data_parallel(self, address: str) -> int:
        """Join the group (all ranks at once) and wrap the model in DDP; returns the GPU id Ray gave this rank
        (-1 on CPU), so the caller can check the ranks hold different GPUs."""
        join_data_parallel(self._dp_rendezvous if self.rank == 0 else address, self.rank, self.world_size,
                           self.cfg.device)
        if self.cfg.data_parallel == "fsdp":
            self.trainer = shard_model(self.model)  # in place: the parameters become shards
            self.optimizer = self._optimizer()      # over the shards
            self._gather()
        else:
            self.trainer = wrap_data_parallel(self.model, self.cfg.device)
        gpu_ids = ray.get_gpu_ids()
        return int(gpu_ids[0]) if gpu_ids else -1

    def device(self) -> str:
        return str(self.cfg.device)

    def open_weight_sync(self, world_size: int) -> str:
        """Start the sync group's rendezvous here (rank 0); returns the address the engines join."""
        self._rendezvous = serve_rendezvous(world_size, host=ray.util.get_node_ip_address())
        return f"{ray.util.get_node_ip_address()}:{self._rendezvous.port}"

    def join_weight_sync(self, world_size: int) -> None:
        group = join_group(self._rendezvous, 0, world_size, self.cfg.device)
        self._sender = BroadcastSender(group, plan_layout(self._published(), SYNC_BUCKET_BYTES))

    def broadcast_weights(self) -> int:
        """Send the trainable tensors to every engine of the sync group; returns their version."""
        self.version += 1
        self._sender.send(self._published())
        return self.version

    def update(self, generated: tuple[Rollout, list[str]], rewards: np.ndarray) -> dict:
        rollout, _ = generated
        rewards = np.array(rewards)  # the object store hands out read-only arrays
        staleness = {"staleness": self.version - rollout.weight_version}
        if self.critic is not None:  # PPO: every sample counts, advantages per token from the critic
            every = torch.ones(len(rewards) // self.cfg.group_size, dtype=torch.bool)
            return rollout_metrics(rollout, rewards, every) | staleness | update_actor_critic(
                self.trainer, self.optimizer, self.critic, self.critic_optimizer, rollout, torch.as_tensor(rewards),
                self.cfg, self.ref_model, self.compute_dtype)
        advantages, keep = group_advantages(rewards, self.cfg.group_size, self.cfg.norm_std, self.cfg.filter_groups)
        metrics = rollout_metrics(rollout, rewards, keep) | staleness
        if keep.any():  # every rank sees the same rewards, so all ranks take this branch or none
            kept, kept_advantages = rollout.select_groups(keep), advantages[keep.repeat_interleave(self.cfg.group_size)]
            # self.trainer: the DDP-wrapped or FSDP-sharded model on > 1 ranks, the model itself on one
            metrics |= update_policy(self.trainer, self.optimizer, kept, kept_advantages, self.cfg, self.ref_model,
                                     rank=self.rank, world_size=self.world_size, compute_dtype=self.compute_dtype)
            if is_sharded(self.model):
                self._gather()
        return metrics

    def save(self, path: str, extra: dict | None = None) -> str:
        """Every rank takes this call (`LearnerGroup.save`); rank 0 writes whole tensors, atomically (under FSDP
        the ranks gather them together first: model and AdamW state, as one learner's checkpoint would hold).
        `extra`: the driver's counters. Loadable with torch.load(weights_only=True)."""
        if is_sharded(self.model):
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

            model, optimizer = get_state_dict(self.model, self.optimizer,
                                              options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        elif self.rank == 0:
            model, optimizer = self.model.state_dict(), self.optimizer.state_dict()
        if self.rank == 0:
            critic = {} if self.critic is None else {"critic": self.critic.state_dict(),
                                                     "critic_optimizer": self.critic_optimizer.state_dict()}
            save_atomic({"model": model, "optimizer": optimizer, "version": self.version, "extra": extra or {},
                         **critic}, path)
        return path

    def load(self, path: str) -> dict:
        """Every rank restores the checkpoint `save` wrote (under FSDP each keeps its shards of it); returns
        its `extra`. The KL reference stays the initial policy this learner was built as."""
        state = torch.load(path, map_location="cpu", weights_only=True)
        if is_sharded(self.model):
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optimizer"], options=StateDictOptions(full_state_dict=True))
            self._gather()
        else:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.version = int(state["version"])
        return dict(state["extra"])

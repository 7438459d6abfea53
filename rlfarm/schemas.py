"""Hydra structured-config schemas: conf/train.yaml's own keys (`TrainSchema`), each conf/algo/<name>.yaml
(`/schema/algo/<name>`) and the gymnasium envs (`/schema/env/gym`) list theirs first in their defaults, so Hydra
checks types and choices while it composes, and an unknown key fails there too. Values come from the YAML files
(the schemas hold no defaults: one place for them).

Ranges are checked when the composed node becomes the dataclass (`OmegaConf.to_object`, in preflight): each
schema's `__post_init__` is `rlfarm.settings.check_ranges`, the same rules the algorithms' own configs apply.
Stored in Hydra's ConfigStore (under schema/) when this module is imported: rlfarm.config imports it, so
every composition (`rlfarm.config.compose`, the Hydra app of rlfarm.cli) finds them.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Optional

from hydra.core.config_store import ConfigStore

from rlfarm.families import FAMILIES
from rlfarm.settings import RangeError, check_ranges


class Choice(str, Enum):
    """A choice Hydra checks by name at compose time; afterwards it reads as its plain string (`"ddp"`)."""

    def __str__(self) -> str:
        return self.value


class WeightSync(Choice):
    """learner → engine: auto picks ipc (one GPU), broadcast (separate GPUs) or object_store (CPU); rlfarm.sync"""
    auto = "auto"
    object_store = "object_store"
    broadcast = "broadcast"
    ipc = "ipc"


class EngineCapture(Choice):  # when the engine captures its decode step's graphs (rlfarm/engines/decode_graphs.py)
    ahead = "ahead"
    first_use = "first_use"
    auto = "auto"


class DataParallel(Choice):  # rlfarm.data_parallel: a learner holding > 1 GPU
    ddp = "ddp"
    fsdp = "fsdp"


class IsCorrection(Choice):  # rlfarm/algos/grpo_lm.py: importance weights learner/engine, truncated at is_cap
    auto = "auto"  # token_tis with asynchronous rollouts (algo.max_staleness > 0), none without
    none = "none"
    token_tis = "token_tis"
    seq_tis = "seq_tis"


class Advantage(Choice):  # grpo: rewards normalized within each group | gae: a critic and token-level GAE
    grpo = "grpo"
    gae = "gae"


# algo.family: one of the family records' names (rlfarm/families.py), so a wrong one fails while Hydra composes
FamilyName = Choice("FamilyName", {name: name for name in FAMILIES})


class RewardTarget(Choice):  # rlfarm fit-reward: what the fitted model learns to predict
    env_reward = "env_reward"
    success = "success"
    file = "file"


class Ranged:
    """A schema whose fields are checked against rlfarm.settings.RANGES when it is built."""

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass
class AlgoSchema(Ranged):
    name: str
    family: FamilyName


@dataclass
class SACSchema(AlgoSchema):
    lr: float
    actor_lr: float
    batch_size: int
    utd_ratio: float
    learning_starts: int
    buffer_size: int
    publish_every: int
    chunk_steps: int
    credits: int
    agent: Any  # a _target_ node: rlfarm.algos.sac.SACAgent's arguments


class VTraceLoss(Choice):
    """IMPALA's policy gradient or APPO's clipped surrogate, on V-trace's advantages (rlfarm/algos/vtrace.py)"""
    impala = "impala"
    appo = "appo"


@dataclass
class ActorLearnerSchema(AlgoSchema):
    """IMPALA and APPO (conf/algo/impala.yaml, appo.yaml): the farm's data path, V-trace at the learner."""
    loss: VTraceLoss
    chunk_steps: int
    batch_chunks: int
    credits: int
    max_policy_lag: int
    publish_every: int
    lr: float
    gamma: float
    rho_bar: float
    c_bar: float
    lam: float
    clip_eps: float
    vf_coef: float
    ent_coef: float
    max_grad_norm: float
    epochs: int
    bf16: bool
    target_return: Optional[float]
    target_update_every: int = 0  # appo: 0 clips π/μ (the runners' policy); K > 0 clips π/π_target, refreshed every K updates
    compile: bool = False  # torch.compile the learner's forward (one compile per batch shape)


@dataclass
class PPOSchema(AlgoSchema):
    rollout_steps: int
    lr: float
    anneal_lr: bool
    gamma: float
    gae_lambda: float
    epochs: int
    minibatches: int
    clip_eps: float
    value_clip_eps: Optional[float]
    vf_coef: float
    ent_coef: float
    max_grad_norm: float
    norm_adv: bool
    target_kl: Optional[float]
    target_return: Optional[float]


@dataclass
class GroupPolicySchema(AlgoSchema):
    """What GRPO on text and on a simulator share: groups of samples, the clipped token loss, a budget."""
    group_size: int
    temperature: float
    lr: float
    max_grad_norm: float
    clip_low: float
    clip_high: float
    minibatches: int
    norm_std: bool
    max_updates: int


@dataclass
class GRPOSchema(GroupPolicySchema):
    prompts_per_step: int
    max_new_tokens: Optional[int]
    top_p: float
    kl_coef: float
    filter_groups: bool
    advantage: Advantage
    micro_batch_size: Optional[int]
    micro_batch_tokens: Optional[int]
    packed: bool
    activation_checkpointing: bool
    compile_layers: bool
    data_parallel: DataParallel
    weight_sync: WeightSync
    target_reward: Optional[float]
    is_correction: IsCorrection
    is_cap: float
    max_staleness: int
    partial_rollouts: bool
    synthetic_lengths: Any  # a speed-run setting: {median_frac, p99_frac} of the cap
    engine_capture: EngineCapture


@dataclass
class PPOLMSchema(GRPOSchema):
    gamma: float
    gae_lambda: float
    critic_lr: float
    value_clip: Optional[float]


class ServerDtype(Choice):  # a VLA inference server's HF model (rlfarm/roles/vla_server.py: inference_dtype)
    auto = "auto"          # bfloat16 on a GPU, float32 elsewhere
    float32 = "float32"
    bfloat16 = "bfloat16"


@dataclass
class GRPOVLASchema(GroupPolicySchema):
    groups_per_update: int
    accuracy_low: float
    accuracy_high: float
    pipeline: bool
    target_success: Optional[float]
    # With an engine role in the topology: its batching inference server fires at this many observations or this long
    # after a batch's first request (rlfarm/roles/vla_server.py)
    server_max_batch: int = 256
    server_max_wait_ms: float = 5.0
    server_dtype: ServerDtype = ServerDtype.auto
    server_graphs: bool = True   # decode action tokens from CUDA graphs (HF VLAs on a GPU; else ignored)


class Critic(Choice):  # algo=ppo_vla: where V(observation) comes from (rlfarm/algos/ppo_vla.py)
    shared = "shared"      # a value head on the policy's own trunk
    separate = "separate"  # a network of the policy's kind of its own


@dataclass
class PPOVLASchema(GroupPolicySchema):
    groups_per_update: int
    pipeline: bool
    target_success: Optional[float]
    gamma: float
    gae_lambda: float
    value_coef: float
    value_clip: Optional[float]
    epochs: int
    critic: Critic
    server_max_batch: int = 256
    server_max_wait_ms: float = 5.0
    server_dtype: ServerDtype = ServerDtype.auto
    server_graphs: bool = True   # decode action tokens from CUDA graphs (HF VLAs on a GPU; else ignored)


@dataclass
class GymEnvSchema(Ranged):
    id: str
    num_envs: int
    workers: int  # processes stepping the num_envs sub-envs; 0: the runner's own (rlfarm/envs/vector.py)
    batch_render: bool  # MuJoCo sub-envs of a process rendered as tiles in one GL context (envs/vector.py)
    kwargs: Any  # gymnasium.make's keyword arguments
    # Modules imported before the id is looked up, in every process (rlfarm/envs/registry.py): those that register
    # a plain env.id of the user's own.
    imports: Optional[list[str]] = None
    # GPUs the runners render on through EGL (runner i on render_gpus[i % len]); None: the node's GPUs without a
    # learner where there are any, else all of them (rlfarm/topology.py: render_layout).
    # Keeps rendering off GPUs that are busy with something else, e.g. the reward model's (docs/benchmarks.md).
    render_gpus: Optional[list[int]] = None
    # Double buffering: the sub-envs in `groups` groups, one group's policy forward overlapping another's step
    # (rlfarm/envs/vector.py, roles/env_runner.py). It hides the forward's host-side time (with env.workers, the whole
    # step); it cannot hide a GPU that many runners time-share (Atari on 4x H200: 0.49x vs 0.55x, docs/benchmarks.md).
    groups: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.workers <= self.num_envs:
            raise RangeError("workers", f"in [0, num_envs] = [0, {self.num_envs}]", self.workers)
        if not 1 <= self.groups <= self.num_envs or self.workers % self.groups:
            raise RangeError("groups", f"in [1, num_envs={self.num_envs}] and a divisor of workers={self.workers}",
                             self.groups)
        if self.render_gpus is not None and (not self.render_gpus or min(self.render_gpus) < 0):
            raise RangeError("render_gpus", "null or a non-empty list of GPU indices", self.render_gpus)


@dataclass
class LabelerSchema(Ranged):
    bus_items: int
    bus_timeout_s: float


@dataclass
class RaySchema(Ranged):
    address: Optional[str]
    num_cpus: Optional[float]
    num_gpus: Optional[int]
    dashboard: bool
    ready_timeout_s: float


LIVE_VIEW = ("auto", True, False)


@dataclass
class RunSchema(Ranged):
    metrics_interval_s: float
    live: Any  # auto | true | false (OmegaConf has no Union type)
    checkpoint: bool
    checkpoint_every_updates: int
    checkpoint_every_min: float
    checkpoint_buffer: bool
    max_restarts: int
    restart_timeout_s: float
    role_timeout_s: float
    max_wall_s: Optional[float]
    memory_check: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if not any(self.live is choice if isinstance(choice, bool) else self.live == choice for choice in LIVE_VIEW):
            raise RangeError("live", "one of auto|true|false", self.live)


@dataclass
class TrainSchema(Ranged):
    """conf/train.yaml's own keys; each config group is checked by its own schema (or not at all)."""
    topology: Any
    env: Any
    reward: Any
    model: Any
    algo: Any
    logger: Any
    seed: int
    total_env_steps: int
    resume: Optional[str]
    labeler: LabelerSchema
    ray: RaySchema
    run: RunSchema


@dataclass
class FitSchema(Ranged):
    epochs: int
    batch_size: int
    lr: float
    weight_decay: float
    holdout: float
    device: str
    compile: bool


@dataclass
class FitRewardSchema(Ranged):
    """conf/fit_reward.yaml's own keys (rlfarm fit-reward)."""
    env: Any
    net: Any
    target: RewardTarget
    labels: Optional[str]
    policy: Any  # random, a run dir, or a list of them (each collects an equal share)
    frames: int
    frame_size: int
    frame_stack: int
    num_envs: int
    seed: int
    fit: FitSchema
    report_frames: int


class PathKind(Enum):
    file = "file"  # a non-empty file
    model = "model"  # a folder written by save_pretrained (has config.json), or a hub id like org/name


@dataclass(frozen=True)
class PathSetting:
    kind: PathKind
    wanted: str  # what the fix asks for


# Settings that name something on disk, and what each must be. rlfarm.config.paths.check_paths checks them before
# anything starts: a role that cannot open its model or file dies only after Ray started, in a wall of log.
PATH_SETTINGS = {
    "reward.model": PathSetting(PathKind.model, "a model folder written by save_pretrained, or a hub id like "
                                                "openai/clip-vit-base-patch16"),  # reward=clip, HF reward models
    "reward.checkpoint": PathSetting(PathKind.file, "a state_dict or TorchScript file, or null"),  # reward=model
    "reward.teacher.model": PathSetting(PathKind.model, "a model folder written by save_pretrained, a hub id or a "
                                                        "judge shape like qwen2-vl-2b_shape"),  # reward=distilled
    "model.source": PathSetting(PathKind.model, "a folder written by save_pretrained, or a hub id like "
                                                "Qwen/Qwen2.5-0.5B"),  # model=hf_lm|hf_vla (a VLA: a folder only)
    "env.path": PathSetting(PathKind.file, "a .jsonl or .parquet file of question/answer records"),  # env=prompts
}

# The same key where one `_target_` reads something else: (key, the node's _target_) → what it must be.
PATH_SETTINGS_BY_TARGET = {
    ("reward.model", "rlfarm.rewards.model.ModuleReward"): PathSetting(PathKind.file, "a TorchScript file or one written by rlfarm fit-reward"),
    ("reward.teacher.model", "rlfarm.rewards.model.ModuleReward"): PathSetting(PathKind.file, "a TorchScript file or one written by rlfarm fit-reward"),
}

# Nodes of groups without a schema whose keys are data, not rlfarm settings, so any key may be added with `+`
# (rlfarm.config.known_keys). A schema's Any-typed dict (env.kwargs of gymnasium envs) is free-form too.
FREE_FORM_KEYS = ("env.kwargs",  # the env's constructor arguments (ManiSkill, SAPIEN)
                  "model.config",  # an HF model config (model_type, hidden_size, ...)
                  "model.lora",  # LoRA's arguments (r, alpha, target_modules, ...)
                  "topology.pools",  # pool names are the topology's own
                  "logger.wandb")  # wandb.init's keyword arguments


ALGO_SCHEMAS = {"sac": SACSchema, "impala": ActorLearnerSchema, "appo": ActorLearnerSchema, "ppo": PPOSchema, "grpo": GRPOSchema, "ppo_lm": PPOLMSchema,
                "grpo_vla": GRPOVLASchema, "ppo_vla": PPOVLASchema}


STORE = ConfigStore.instance()
STORE.store(group="schema", name="train", node=TrainSchema)
STORE.store(group="schema", name="fit_reward", node=FitRewardSchema)
STORE.store(group="schema/env", name="gym", node=GymEnvSchema)
for name, schema in ALGO_SCHEMAS.items():
    STORE.store(group="schema/algo", name=name, node=schema)

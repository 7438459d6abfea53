"""The actor-learner agent (IMPALA, APPO): one actor-critic network, its optimizer, and the update that turns a
batch of stale trajectories into one gradient step with V-trace (rlfarm/algos/vtrace.py) correcting for the lag.

    chunks (from many runners, flat [T·N] as they travel) → `trajectories` ([T, N] per chunk length)
      → forward π, V on every step (bf16 autocast on CUDA) → V-trace targets → impala_loss | appo_loss → Adam step

A runner's chunk is T consecutive steps of its N sub-envs; chunks of the same length sit side by side (N grows),
so V-trace runs over [T, ΣN] at once. V of each step's true next state comes from the same forward: obs[t + 1] is
the next state inside a chunk; the last step's, and a truncated step's (its final obs), are looked up in next_obs.
"""
from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from rlfarm.algos.vtrace import appo_loss, impala_loss, vtrace
from rlfarm.settings import check_ranges, known_fields

LOSSES = ("impala", "appo")
# What the update reads of every step of a chunk: the runner's arrays (behaviour log-probs included) and the labeled
# reward; next_obs only where V-trace looks it up (see `trajectories`).
STEP_FIELDS = ("obs", "action", "logprob", "reward", "terminated", "truncated")


@dataclass(frozen=True)
class VTraceConfig:
    loss: str = "impala"          # impala: −ρA log π; appo: the clipped surrogate on π/μ
    lr: float = 1e-3
    gamma: float = 0.99
    rho_bar: float = 1.0          # ρ̄: truncates the importance weight of each temporal difference
    c_bar: float = 1.0            # c̄: truncates the trace that carries it back
    lam: float = 1.0              # λ of the traces (1: IMPALA's V-trace)
    clip_eps: float = 0.2         # appo only
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    max_grad_norm: float = 40.0
    epochs: int = 1               # gradient steps per batch (V-trace keeps each one's targets correct)
    bf16: bool = True             # autocast the forward to bf16 on CUDA (the losses stay in float32)
    target_update_every: int = 0  # appo: 0 clips π/μ; K > 0 clips π/π_target, a copy refreshed every K updates
    compile: bool = False         # torch.compile the forward (one compile per batch shape)

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {self.loss!r}")
        check_ranges(self)

    @classmethod
    def from_mapping(cls, values: Mapping) -> "VTraceConfig":
        return cls(**known_fields(cls, values))


class BatchStaging:
    """Host → device for the learner's batches. On CUDA each field is gathered from the chunks straight into a pinned
    buffer of its own (kept and reused) and copied without blocking: a pageable copy would make the host wait for the
    GPU to finish the previous update first (it runs in stream order), so host and GPU would take turns. Each field
    has two buffers used in turn (`next_batch` flips them), and the host writes one again only once its last copy has
    left (an event per buffer): the host can gather a batch while the GPU still trains on the one before. On CPU: plain
    arrays."""

    SLOTS = 2

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self._buffers: dict[tuple[str, int], tuple[torch.Tensor, torch.cuda.Event | None]] = {}
        self._slot = 0

    def next_batch(self) -> None:
        """The next batch's fields go to the other set of buffers."""
        self._slot = (self._slot + 1) % self.SLOTS

    def host(self, key: str, shape: tuple[int, ...], dtype: np.dtype) -> torch.Tensor:
        """A host tensor of `shape` to fill (through `.numpy()`) and then `upload`."""
        if self.device.type != "cuda":
            return torch.from_numpy(np.empty(shape, dtype))
        size = int(np.prod(shape))
        buffer, copied = self._buffers.get((key, self._slot), (None, None))
        if copied is not None:
            copied.synchronize()  # its last copy to the device has finished
        if buffer is None or buffer.numel() < size or buffer.numpy().dtype != np.dtype(dtype):
            buffer = torch.from_numpy(np.empty(max(size, 1), dtype)).pin_memory()
            self._buffers[(key, self._slot)] = (buffer, None)
        return buffer[:size].view(shape)

    def upload(self, key: str, host: torch.Tensor) -> torch.Tensor:
        if self.device.type != "cuda":
            return host
        on_device = host.to(self.device, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._buffers[(key, self._slot)] = (self._buffers[(key, self._slot)][0], event)
        return on_device

    def stage(self, key: str, array: np.ndarray) -> torch.Tensor:
        """One array (already gathered) to the device through its pinned buffer."""
        host = self.host(key, array.shape, array.dtype)
        host.numpy()[...] = array
        return self.upload(key, host)


def trajectories(chunks: list[tuple[dict, dict]], staging: BatchStaging | torch.device | str
                 ) -> list[dict[str, torch.Tensor]]:
    """Labeled chunks (meta with "envs", flat [T·N, ...] arrays) → one dict of [T, ΣN, ...] tensors per chunk length,
    the chunks of a length side by side. Image observations stay uint8 until they are on the device. Of next_obs only
    the rows V-trace looks up travel (each chunk's last step and its truncated steps): `lookup_obs` at
    (`lookup_t`, `lookup_n`)."""
    if not isinstance(staging, BatchStaging):
        staging = BatchStaging(staging)
    staging.next_batch()
    by_length: dict[int, list[tuple[int, dict]]] = {}
    for meta, chunk in chunks:
        envs = int(meta["envs"])
        by_length.setdefault(meta["size"] // envs, []).append((envs, chunk))
    return [_group(steps, parts, staging) for steps, parts in by_length.items()]


def _group(steps: int, parts: list[tuple[int, dict]], staging: BatchStaging) -> dict[str, torch.Tensor]:
    total = sum(envs for envs, _ in parts)
    group = {}
    for key in STEP_FIELDS:
        first = np.asarray(parts[0][1][key])
        name = f"{steps}/{key}"
        host = staging.host(name, (steps, total, *first.shape[1:]), first.dtype)
        columns, at = host.numpy(), 0
        for envs, chunk in parts:
            columns[:, at:at + envs] = np.asarray(chunk[key]).reshape(steps, envs, *first.shape[1:])
            at += envs
        group[key] = staging.upload(name, host)
    times, columns, rows, at = [], [], [], 0
    for envs, chunk in parts:
        look = np.asarray(chunk["truncated"]).reshape(steps, envs).copy()
        look[-1] = True
        t, n = np.nonzero(look)
        next_obs = np.asarray(chunk["next_obs"])
        rows.append(next_obs.reshape(steps, envs, *next_obs.shape[1:])[t, n])
        times.append(t)
        columns.append(n + at)
        at += envs
    group["lookup_t"] = staging.stage(f"{steps}/lookup_t", np.concatenate(times))
    group["lookup_n"] = staging.stage(f"{steps}/lookup_n", np.concatenate(columns))
    group["lookup_obs"] = staging.stage(f"{steps}/lookup_obs", np.concatenate(rows))
    return group


class VTraceAgent:
    """`actor` is the whole actor-critic (what the runners act with and `rlfarm eval` loads)."""

    def __init__(self, model: nn.Module, cfg: VTraceConfig, device: str | torch.device = "cpu"):
        self.cfg, self.device = cfg, torch.device(device)
        self.actor = model.to(self.device)
        # eps=1e-5 rather than 1e-8: steadier with large, noisy advantages (the PPO baselines' choice)
        self.optimizer = torch.optim.Adam(self.actor.parameters(), lr=cfg.lr, eps=1e-5)
        on_cuda = self.device.type == "cuda"
        self._autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cfg.bf16 and on_cuda \
            else contextlib.nullcontext
        # Data-parallel ranks set this: averages the gradients over the ranks after each backward.
        self.average_gradients: Callable[[list[nn.Parameter]], None] | None = None
        # APPO's optional target network: the policy the clip is anchored to, refreshed every target_update_every steps
        self.target = copy.deepcopy(self.actor).requires_grad_(False) if cfg.target_update_every else None
        self.steps = 0  # gradient steps so far (the target's clock)
        # The forward through π and V of a batch, compiled when asked (dynamic=False: batches of batch_chunks full
        # chunks all have one shape; another, e.g. a run's last shorter chunks, compiles once more, up to dynamo's
        # limit of shapes, then runs eager).
        self._evaluate = torch.compile(self.actor.evaluate, dynamic=False) if cfg.compile else self.actor.evaluate

    def policy_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.actor.state_dict().items()}

    def state_dict(self) -> dict:
        target = {} if self.target is None else {"target": self.target.state_dict()}
        return {"actor": self.actor.state_dict(), "optimizer": self.optimizer.state_dict(), "steps": self.steps,
                **target}

    def load_state_dict(self, state: dict) -> None:
        self.actor.load_state_dict(state["actor"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state.get("steps", 0))
        if self.target is not None:
            self.target.load_state_dict(state.get("target", state["actor"]))

    def update(self, groups: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """`cfg.epochs` gradient steps on the batch (groups from `trajectories`). Returns the last step's parts."""
        parts: dict[str, torch.Tensor] = {}
        for _ in range(self.cfg.epochs):
            loss, parts = self.loss(groups)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if self.average_gradients is not None:
                self.average_gradients(list(self.actor.parameters()))
            parts["grad_norm"] = nn.utils.clip_grad_norm_(self.actor.parameters(), self.cfg.max_grad_norm)
            self.optimizer.step()
            self.steps += 1
            if self.target is not None and self.steps % self.cfg.target_update_every == 0:
                self.target.load_state_dict(self.actor.state_dict())
        return {k: v.detach() for k, v in parts.items()}

    def loss(self, groups: list[dict[str, torch.Tensor]]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss over all groups, each weighted by its share of the batch's steps."""
        total_steps = sum(g["reward"].numel() for g in groups)
        loss, parts = 0.0, {}
        for group in groups:
            share = group["reward"].numel() / total_steps
            group_loss, group_parts = self._group_loss(group)
            loss = loss + share * group_loss
            for key, value in group_parts.items():
                parts[key] = parts.get(key, 0.0) + share * value
        return loss, parts

    def _group_loss(self, g: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        steps, envs = g["reward"].shape
        flat_obs = _network_input(g["obs"].reshape(steps * envs, -1))
        flat_actions = g["action"].reshape(steps * envs, *g["action"].shape[2:])
        with self._autocast():
            logprob, entropy, value = self._evaluate(flat_obs, flat_actions)
        logprob, entropy, value = (x.float().reshape(steps, envs) for x in (logprob, entropy, value))
        next_values = self._next_values(g, value.detach())
        anchor = self._target_logprob(flat_obs, flat_actions).reshape(steps, envs) if self.target is not None \
            else None
        trace = vtrace(g["logprob"].float(), logprob.detach() if anchor is None else anchor, g["reward"].float(),
                       value.detach(), next_values, g["terminated"], g["truncated"], self.cfg.gamma, self.cfg.rho_bar,
                       self.cfg.c_bar, self.cfg.lam)
        if self.cfg.loss == "impala":
            loss, parts = impala_loss(logprob, entropy, value, trace, self.cfg.vf_coef, self.cfg.ent_coef)
        else:
            loss, parts = appo_loss(logprob, g["logprob"].float() if anchor is None else anchor, entropy, value, trace,
                                    self.cfg.clip_eps, self.cfg.vf_coef, self.cfg.ent_coef,
                                    anchored_to_target=anchor is not None)
        parts["rho_mean"] = trace.clipped_rho.mean()
        return loss, parts

    @torch.no_grad()
    def _target_logprob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        with self._autocast():
            logprob, _, _ = self.target.evaluate(obs, actions)
        return logprob.float()

    @torch.no_grad()
    def _next_values(self, g: dict[str, torch.Tensor], value: torch.Tensor) -> torch.Tensor:
        """V of the state each step led to [T, N]: the next row's V inside the chunk; V(next_obs) for the last
        step and for truncated steps (the reset obs follows them in obs); terminated steps do not bootstrap."""
        next_values = torch.empty_like(value)
        next_values[:-1] = value[1:]
        looked_up = g["lookup_obs"]
        with self._autocast():
            values = self.actor.value(_network_input(looked_up.reshape(len(looked_up), -1)))
        next_values[g["lookup_t"], g["lookup_n"]] = values.float()
        return next_values


def _network_input(obs: torch.Tensor) -> torch.Tensor:
    """Images go in as uint8 (the conv network scales them: a float copy of a batch of frames is 4× the memory);
    vector observations as float32."""
    return obs if obs.dtype == torch.uint8 else obs.float()

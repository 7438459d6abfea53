"""ManiSkill3 tabletop tasks batched: N scenes in one ManiSkill env, stepped together, pictured together.

`ManiSkillGPUTasks` holds one ManiSkill3 env with `num_envs` parallel scenes. With `sim_backend="gpu"` (PhysX on
CUDA) one physics system steps every scene at once and the cameras of all scenes render in one batched call on the
GPU, so a single process can feed an inference server thousands of observations per policy call. With
`sim_backend="cpu"` the same class runs ManiSkill's CPU backend, which holds one scene only (num_envs=1 in
ManiSkill 3.0): that is what CPU machines and CI test.

The task, camera, proprio and instruction choices are `rlfarm.envs.maniskill_tasks`' (one table for both), so an
observation here is the stack of N `ManiSkillTask` observations:

  Observations.image         uint8 torch [N, 3, S, S] on `device` (the GPU under sim_backend="gpu")
  Observations.proprio       float32 torch [N, 5]: tool-centre point (x, y, z) and the two finger joints
  Observations.instructions  list[str] of N: each env's instruction, drawn from its reset seed as ManiSkillTask does

Interface for a rollout worker (one batch of episodes at a time; every env starts at `reset`):

  tasks = ManiSkillGPUTasks("PushCube-v1", num_envs=N, image_size=64, max_steps=50)
  obs = tasks.reset(seeds)                  # N ints: a GRPO group is G envs given the same seed
  while not tasks.done.all():
      actions = policy(obs)                 # [N, K, D] in [-1, 1] (torch on any device, or numpy)
      result = tasks.step_chunk(actions)    # K physics steps of every scene, one picture at the end
      # result.obs, result.success [N] bool, result.done [N] bool, result.steps [N] int64 (steps run this chunk)

`step_chunk(actions, live=None)` runs K steps. An env runs a step while it is `live` (default: every env) and its
episode is not over; the others get a zero action, which holds a `pd_*_delta_*` controller where it is. One GPU
physics system cannot step a subset of its scenes, so a held env's physics still moves on (a sliding cube keeps
sliding): hold only envs whose episode is over, or accept that. Success and episode ends are ManiSkillTask's: an
episode ends on the first step the task's success test holds (success) or at `max_steps` (truncation); `success`
and `done` stay set until the next `reset`, and a finished env's later steps count nowhere. Everything is tracked
on the env's device: a chunk costs no host synchronization until the caller reads a result.

Pictures: one per chunk, after its last step (the policy infers from the observation after the chunk), never for
the K - 1 steps before it.

Seeding (what ManiSkill 3.0.1 does, read from its source): `reset(seed=[s_0, ..., s_N-1])` seeds one numpy
episode RNG per scene, but PushCube/PickCube place the cube and goal with `torch.rand((N, ...))` under
`torch.manual_seed(s_0)`, and the table scene draws the arm's initial joint noise from scene 0's RNG (per scene
only with `enhanced_determinism=True`). So a scene's start depends on the first seed and its index, not on its own
seed, and two scenes reset with the same seed do NOT start alike. This class therefore resets all scenes with the
seed list (deterministic: the same list gives the same starts), then copies the start of each seed's first scene
onto the other scenes of that seed (ManiSkill's `reset_to_env_states`: actors, kinematic goal markers, the arm's
joints and velocities, controller targets reset), so a GRPO group starts from identical states and pictures.
ManiSkill can also reset a subset of scenes (`options={"env_idx": ...}`); the rollout resets whole batches, so
this class does not.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rlfarm.envs import maniskill_tasks
from rlfarm.envs.maniskill_tasks import PROPRIO_DIM, TASKS, camera_rgb, proprio_tensor, seed_instruction

SIM_BACKENDS = {"gpu": "physx_cuda", "cpu": "physx_cpu"}


def physx_gpu_library() -> Path:
    """Where SAPIEN looks for PhysX's GPU library (closed source, not in the sapien wheel): it downloads it from
    GitHub there on the first GPU simulation, which a machine without internet cannot; copy it there instead."""
    import sapien.physx

    return Path.home() / ".sapien" / "physx" / sapien.physx.version() / "libPhysXGpu_64.so"


@dataclass
class Observations:
    """N observations: image uint8 [N, 3, S, S], proprio float32 [N, 5] (torch, on the env's device), N strings."""

    image: torch.Tensor
    proprio: torch.Tensor
    instructions: list[str]


@dataclass
class ChunkResult:
    """After one chunk: the observations, success and done per episode so far ([N] bool), steps run this chunk
    ([N] int64; 0 for envs held or already done)."""

    obs: Observations
    success: torch.Tensor
    done: torch.Tensor
    steps: torch.Tensor


def group_leaders(seeds: Sequence[int]) -> np.ndarray:
    """[N] index of the first env that holds each env's seed: the env whose start the others of its group copy."""
    first: dict[int, int] = {}
    return np.array([first.setdefault(int(seed), i) for i, seed in enumerate(seeds)], np.int64)


def gather_states(state, index: torch.Tensor):
    """A ManiSkill state dict (nested dicts of [N, D] tensors) with rows taken at `index` ([N] int)."""
    if isinstance(state, dict):
        return {key: gather_states(value, index) for key, value in state.items()}
    return state[index.to(state.device)]


class ManiSkillGPUTasks:
    def __init__(self, task: str = "PushCube-v1", num_envs: int = 256, image_size: int = 64, max_steps: int = 50,
                 control_mode: str = "pd_ee_delta_pos", render_device: str = "auto", sim_backend: str = "gpu",
                 show_goal: bool = True, robot_init_qpos_noise: float = 0.02, sim_config: dict | None = None):
        """sim_backend: gpu (PhysX on CUDA, any num_envs) | cpu (num_envs=1). render_device: auto | cpu | cuda[:N]
        (auto: CUDA where torch sees one; GPU simulation renders on its own GPU). sim_config: ManiSkill's
        (e.g. {"gpu_memory_config": {...}} for very many scenes)."""
        import mani_skill.envs  # noqa: F401 - registers the tasks; imported here: rlfarm runs without mani_skill

        if task not in TASKS:
            raise ValueError(f"task must be one of {sorted(TASKS)} (no downloaded assets), got {task!r}")
        if sim_backend not in SIM_BACKENDS:
            raise ValueError(f"sim_backend must be gpu or cpu, got {sim_backend!r}")
        if sim_backend == "cpu" and num_envs != 1:
            raise ValueError(f"ManiSkill's CPU backend holds one scene per env: num_envs must be 1, got {num_envs} "
                             f"(use sim_backend=gpu on a CUDA machine)")
        if sim_backend == "gpu" and not physx_gpu_library().exists():
            raise RuntimeError(f"GPU simulation needs SAPIEN's PhysX GPU library at {physx_gpu_library()} (SAPIEN "
                               f"downloads it from GitHub on first use; without internet, copy it there)")
        self.task, self.num_envs, self.image_size = task, int(num_envs), int(image_size)
        self.max_steps, self.show_goal = int(max_steps), bool(show_goal)
        render = maniskill_tasks.render_backend(render_device)
        if sim_backend == "gpu" and render == "cpu":
            render = "cuda"  # GPU simulation hands poses to the renderer on the GPU
        extra = {"sim_config": dict(sim_config)} if sim_config else {}
        self.env, self.base, self.camera, space = maniskill_tasks.open_camera_task(
            task, self.image_size, self.max_steps, control_mode, SIM_BACKENDS[sim_backend], render,
            robot_init_qpos_noise, num_envs=self.num_envs, **extra)
        self.action_dim, self.proprio_dim = int(space.shape[0]), PROPRIO_DIM
        self.device = torch.device(self.base.device)
        self.success = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        self.done = torch.ones_like(self.success)  # no episode until reset
        self.episode_steps = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)
        self.instructions: list[str] = []
        # The first picture sets up the batched cameras and compiles shaders: paid here, not in the first episode.
        self.reset(list(range(self.num_envs)))

    def reset(self, seeds: Sequence[int]) -> Observations:
        """Start N episodes; envs given the same seed start identical (see the module docstring)."""
        seeds = [int(seed) for seed in seeds]
        if len(seeds) != self.num_envs:
            raise ValueError(f"need {self.num_envs} seeds (one per env), got {len(seeds)}")
        self.base.reset(seed=seeds)
        leaders = group_leaders(seeds)
        if (leaders != np.arange(self.num_envs)).any():
            states = gather_states(self.base.get_state_dict(), torch.as_tensor(leaders))
            self.base.reset(options={"reset_to_env_states": {"env_states": states}})
        self.instructions = [seed_instruction(self.task, seed) for seed in seeds]
        self.success.zero_()
        self.done.zero_()
        self.episode_steps.zero_()
        return self.observations()

    def step_chunk(self, actions, live=None) -> ChunkResult:
        """actions [N, K, D] in [-1, 1] (clipped); live [N] bool or None (all). Steps all scenes K times."""
        actions = torch.as_tensor(actions, dtype=torch.float32, device=self.device).clamp(-1.0, 1.0)
        if actions.ndim != 3 or actions.shape[0] != self.num_envs or actions.shape[2] != self.action_dim:
            raise ValueError(f"actions must be [{self.num_envs}, K, {self.action_dim}], got {list(actions.shape)}")
        live = (torch.ones_like(self.done) if live is None
                else torch.as_tensor(live, dtype=torch.bool, device=self.device))
        steps = torch.zeros_like(self.episode_steps)
        for k in range(actions.shape[1]):
            running = live & ~self.done
            _, _, _, _, info = self.base.step(actions[:, k] * running[:, None])
            succeeded = info["success"].to(self.device).bool() & running
            steps += running
            self.episode_steps += running
            self.success |= succeeded
            self.done |= succeeded | (running & (self.episode_steps >= self.max_steps))
        return ChunkResult(self.observations(), self.success.clone(), self.done.clone(), steps)

    def observations(self) -> Observations:
        """The current observations, with a picture taken now (one batched render of every scene)."""
        image = camera_rgb(self.base, self.camera, self.show_goal).permute(0, 3, 1, 2).contiguous()
        return Observations(image.to(self.device), proprio_tensor(self.base).to(self.device), list(self.instructions))

    def close(self) -> None:
        self.env.close()

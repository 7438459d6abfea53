"""ManiSkill3 tabletop tasks seen through a camera, with proprio and a language instruction, for the VLA family.

`ManiSkillTask` wraps a ManiSkill3 task that needs no downloaded assets (the table, the cubes and the Panda arm
ship inside the `mani_skill` wheel: PushCube-v1, PickCube-v1, PullCube-v1, StackCube-v1) in the interface of
`rlfarm.envs.sapien_tasks.SapienPushCube`, so the VLA rollout worker drives either one unchanged:

Observations (a mapping):
  image        uint8 [3, S, S]: an RGB picture from the task's own camera ("base_camera"), S = `image_size`.
  proprio      float32 [5]: the gripper's tool-centre-point position (x, y, z) and its two finger joints.
  instruction  str: one of the task's templates (drawn per episode from the reset seed).
Action: float32 [4] in [-1, 1] under ManiSkill's `pd_ee_delta_pos` controller (the default `control_mode`): an
end-effector displacement (x, y, z; ±1 is ManiSkill's largest step, 0.1 m) and the gripper (−1 closed, 1 open).
Any other normalized ManiSkill controller works too, e.g. `pd_joint_delta_pos` ([8]: 7 joints + gripper), which
skips the per-step inverse kinematics and so steps faster (docs/benchmarks.md has both rates).
Reward: 1.0 on the step the task's own success test first holds, which also ends the episode (binary success, as
SimpleVLA-RL trains on); 0 otherwise. Episodes are truncated at `max_steps`.

Physics runs on ManiSkill's CPU backend (`physx_cpu`, one scene per env object). Pictures need Vulkan: on a CPU
machine Mesa's lavapipe (>= 23; scripts/install.sh installs it), on a GPU machine the GPU (`render_device`:
auto takes CUDA where torch sees one, else the CPU).

Pictures are taken only when read. An action chunk of K steps reads only its last step's picture (the rollout
worker infers from the observation after the chunk), and a picture costs far more than a physics step on
lavapipe, so rendering the K − 1 pictures nobody reads would make the env several times slower. An observation therefore
renders its picture on the first `obs["image"]`; reading it after the env has moved on raises, because the
picture would then show a later state.

Seeding: `reset(seed=s)` fixes the initial state (cube, goal, the arm's small joint noise) and the instruction, so a
GRPO group of envs reset with one seed starts from identical states and pictures.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import warnings
from collections.abc import Iterator, Mapping

import gymnasium as gym
import numpy as np

# Task id → instruction templates. Only tasks whose assets ship in the mani_skill wheel (nothing to download).
TASKS = {
    "PushCube-v1": ("push the cube to the red and white target", "push the block onto the target",
                    "slide the cube into the goal region"),
    "PickCube-v1": ("pick up the cube and move it to the green goal", "lift the block to the green goal",
                    "grasp the cube and carry it to the goal"),
    "PullCube-v1": ("pull the cube to the red and white target", "pull the block back onto the target",
                    "drag the cube toward the goal region"),
    "StackCube-v1": ("stack the red cube on the green cube", "put the red block on top of the green block",
                     "place the red cube onto the green cube"),
}
# mani_skill 3.0.1 calls np.isnan on a torch tensor every step: NumPy 2 warns each time, flooding the run's log
warnings.filterwarnings("ignore", message="__array_wrap__ must accept context", category=DeprecationWarning,
                        module="mani_skill")
CAMERA = "base_camera"  # the one sensor camera every task above defines
PROPRIO_DIM = 5


def instruction_vocabulary(tasks=tuple(TASKS)) -> list[str]:
    """Every word an instruction of these tasks can hold, sorted: the tiny VLA's fixed language vocabulary."""
    return sorted({word for task in tasks for template in TASKS[task] for word in template.split()})


def episode_instruction(task: str, rng: np.random.Generator) -> str:
    """One of the task's templates, drawn from the episode's generator (gymnasium's `np_random` of the reset seed)."""
    templates = TASKS[task]
    return templates[rng.integers(len(templates))]


def seed_instruction(task: str, seed: int) -> str:
    """The instruction `ManiSkillTask.reset(seed=seed)` gives: the batched tasks draw theirs the same way."""
    return episode_instruction(task, gym.utils.seeding.np_random(int(seed))[0])


def camera_rgb(base, camera, show_goal: bool):
    """What `camera` of the ManiSkill env `base` sees now, for every parallel scene at once: uint8 torch
    [num_envs, S, S, 3] on the render device (`show_goal`: see ManiSkillTask)."""
    hidden = [] if show_goal else base._hidden_objects
    for actor in hidden:
        actor.hide_visual()
    base.scene.update_render(update_sensors=True, update_human_render_cameras=False)
    camera.capture()
    rgb = camera.get_obs(rgb=True, depth=False, position=False, segmentation=False)["rgb"]
    for actor in hidden:
        actor.show_visual()
    return rgb


def proprio_tensor(base):
    """float32 torch [num_envs, PROPRIO_DIM]: the tool-centre point's position and the two finger joints."""
    import torch

    agent = base.agent
    return torch.cat([agent.tcp.pose.p, agent.robot.get_qpos()[:, -2:]], dim=1).float()


def render_backend(render_device: str) -> str:
    """'auto' → 'cuda' where torch sees a GPU, else 'cpu'; 'cpu', 'cuda' and 'cuda:N' pass through."""
    if render_device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    if render_device == "cpu" or render_device.split(":")[0] == "cuda":
        return render_device
    raise ValueError(f"render_device must be auto, cpu, cuda or cuda:N, got {render_device!r}")


def rendering_problem(render_device: str = "cpu") -> str | None:
    """None where ManiSkill3 can render on `render_device` here, else one line saying why not. The Vulkan check
    runs in a subprocess: SAPIEN on a Mesa it refuses (< 23) fails and then segfaults, taking its process down."""
    if importlib.util.find_spec("mani_skill") is None:
        return "mani_skill is not installed (pip install -e .[sim])"
    code = f"import sapien; sapien.render.RenderSystem(sapien.Device({render_backend(render_device)!r}))"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "starting a SAPIEN render system took over 120 s"
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or [f"exit code {out.returncode}"])[-1]
        return (f"no Vulkan device renders ({last}); on a CPU machine scripts/install.sh installs Mesa >= 23 "
                f"lavapipe (as root)")
    return None


class Observation(Mapping):
    """One observation; its picture is rendered on the first read of "image", only while the env still shows
    the state it was taken at (see the module docstring)."""

    def __init__(self, env: "ManiSkillTask", fields: dict):
        self._env, self._fields, self._tick, self._image = env, fields, env.tick, None

    def __getitem__(self, key: str):
        if key != "image":
            return self._fields[key]
        if self._image is None:
            if self._env.tick != self._tick:
                raise RuntimeError("this observation's picture was not read before the env stepped or reset; "
                                   "read obs['image'] before stepping again")
            self._image = self._env.picture()
        return self._image

    def __iter__(self) -> Iterator[str]:
        return iter(("image", *self._fields))

    def __len__(self) -> int:
        return 1 + len(self._fields)


def open_camera_task(task: str, image_size: int, max_steps: int, control_mode: str, sim_backend: str, render: str,
                     robot_init_qpos_noise: float, **make_kwargs):
    """gym.make of a ManiSkill task with state-free observations, a sparse reward and its camera at `image_size`;
    (env, env.unwrapped, the camera sensor, the single env's action space, checked to be [-1, 1])."""
    env = gym.make(task, obs_mode="none", reward_mode="sparse", control_mode=control_mode, sim_backend=sim_backend,
                   render_backend=render, sensor_configs={"width": image_size, "height": image_size},
                   robot_init_qpos_noise=robot_init_qpos_noise, max_episode_steps=max_steps, **make_kwargs)
    base = env.unwrapped
    if CAMERA not in base._sensors:
        raise RuntimeError(f"{task} has no '{CAMERA}' camera: rendering is off (no Vulkan device?)")
    space = base.single_action_space
    if not (np.all(space.low == -1.0) and np.all(space.high == 1.0)):
        raise RuntimeError(f"expected a normalized [-1, 1] action space, got {space}")
    return env, base, base._sensors[CAMERA], space


class ManiSkillTask(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, task: str = "PushCube-v1", image_size: int = 64, max_steps: int = 50,
                 render_device: str = "auto", show_goal: bool = True, robot_init_qpos_noise: float = 0.02,
                 control_mode: str = "pd_ee_delta_pos"):
        """show_goal: draw the goal markers ManiSkill hides from its cameras (PickCube's green goal sphere): a
        policy that sees only the picture could not know where the goal is otherwise."""
        import mani_skill.envs  # noqa: F401 - registers the tasks; imported here: rlfarm runs without mani_skill

        if task not in TASKS:
            raise ValueError(f"task must be one of {sorted(TASKS)} (no downloaded assets), got {task!r}")
        self.task, self.image_size, self.max_steps = task, int(image_size), int(max_steps)
        self.show_goal = bool(show_goal)
        self.env, self.base, self.camera, space = open_camera_task(
            task, self.image_size, self.max_steps, control_mode, "physx_cpu", render_backend(render_device),
            robot_init_qpos_noise)
        self.action_space = gym.spaces.Box(-1.0, 1.0, space.shape, np.float32)
        self.observation_space = gym.spaces.Dict({
            "image": gym.spaces.Box(0, 255, (3, self.image_size, self.image_size), np.uint8),
            "proprio": gym.spaces.Box(-np.inf, np.inf, (PROPRIO_DIM,), np.float32),
            "instruction": gym.spaces.Text(max_length=64, charset=" abcdefghijklmnopqrstuvwxyz"),
        })
        self.steps, self.tick, self.instruction = 0, 0, ""
        # The process's first picture compiles the renderer's shaders (tens of seconds on lavapipe): take it now, so
        # that building the env pays for it and the first episode's timings do not.
        self.env.reset(seed=0)
        self.picture()

    # -- gymnasium API ---------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.env.reset(seed=seed)  # ManiSkill seeds its episode RNG (and torch's, for the draw) from it
        self.steps, self.tick = 0, self.tick + 1
        self.instruction = episode_instruction(self.task, self.np_random)
        return self._obs(), {"success": False}

    def step(self, action):
        action = np.clip(np.asarray(action, np.float32), -1.0, 1.0)[None]
        _, _, _, _, info = self.env.step(action)
        self.steps, self.tick = self.steps + 1, self.tick + 1
        success = bool(info["success"][0])
        truncated = not success and self.steps >= self.max_steps
        return self._obs(), float(success), success, truncated, {"success": success}

    def close(self):
        self.env.close()

    # -- observations ----------------------------------------------------------------------------------
    def _obs(self) -> Observation:
        proprio = proprio_tensor(self.base)[0].numpy()
        return Observation(self, {"proprio": proprio, "instruction": self.instruction})

    def picture(self) -> np.ndarray:
        """uint8 [3, S, S]: what the camera sees now."""
        rgb = camera_rgb(self.base, self.camera, self.show_goal)
        return np.ascontiguousarray(rgb[0].cpu().numpy().transpose(2, 0, 1))

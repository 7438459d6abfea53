"""A SAPIEN push-cube task that needs no downloaded assets and no Vulkan: physics only.

A kinematic round pusher, velocity-controlled in the plane, pushes a 4 cm cube on a ground plane toward a
goal that a language instruction names ("push the cube to the left"). Every body is a collision primitive, so
the scene builds from nothing; SAPIEN runs it on its CPU PhysX system.

Observations (a dict):
  image        uint8 [3, S, S]: a top-down *occupancy picture*, drawn with numpy from the physics state —
               channel 0 the pusher, 1 the cube, 2 the goal. It is NOT a camera picture: SAPIEN cameras need
               Vulkan (Mesa >= 23 lavapipe on a CPU machine, see ENVIRONMENT.md), which this env avoids so that
               it runs anywhere `sapien` installs. It carries what a top-down camera would show, without
               shading or perspective.
  proprio      float32 [4]: pusher position and velocity (x, y, vx, vy), what a robot knows of itself.
  state        float32 [6]: pusher, cube and goal positions (privileged; for baselines and debugging).
  instruction  str: one of a few templates over the goal's direction.
Action: float32 [2] in [-1, 1], the pusher's planar velocity as a fraction of `max_speed`.
Reward: 1.0 on the step the cube's centre comes within `success_radius` of the goal, which also ends the
episode (binary success, as SimpleVLA-RL trains on); 0 otherwise. Episodes are truncated at `max_steps`.

Difficulty knobs: `directions` (which goal directions an episode may draw), `goal_distance` and
`success_radius` (how far and how precisely the cube must go), `start_noise` (how far the pusher and cube
start from their canonical places), `max_steps` and `max_speed` (how much slack a wandering policy has).
The pusher always starts behind the cube, on the far side from the goal, so a push straight along the named
direction succeeds; the policy must read the instruction (or the goal in the image) to know which way.
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np

DIRECTIONS = {"left": (-1.0, 0.0), "right": (1.0, 0.0), "forward": (0.0, 1.0), "back": (0.0, -1.0)}
TEMPLATES = ("push the cube to the {}", "move the block {}", "slide the cube {} to the goal")
CUBE_HALF = 0.02
PUSHER_RADIUS = 0.015


def instruction_vocabulary() -> list[str]:
    """Every word an instruction of this task can hold, sorted: the tiny VLA's fixed language vocabulary."""
    words = {word for template in TEMPLATES for word in template.format("").split()}
    return sorted(words | set(DIRECTIONS))


def occupancy_image(pusher: np.ndarray, cube: np.ndarray, goal: np.ndarray, size: int = 32,
                    extent: float = 0.25) -> np.ndarray:
    """uint8 [3, size, size] top-down picture of the square [-extent, extent]²: row 0 is +y (forward)."""
    centres = (np.arange(size) + 0.5) / size * 2 * extent - extent
    x, y = np.meshgrid(centres, centres[::-1])
    pixel = 2 * extent / size
    disc = lambda c, r: (x - c[0]) ** 2 + (y - c[1]) ** 2 <= max(r, pixel / 2) ** 2  # noqa: E731
    square = (np.abs(x - cube[0]) <= CUBE_HALF + pixel / 2) & (np.abs(y - cube[1]) <= CUBE_HALF + pixel / 2)
    image = np.stack([disc(pusher, PUSHER_RADIUS), square, disc(goal, 0.015)])
    return image.astype(np.uint8) * 255


class SapienPushCube(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, directions: tuple[str, ...] = tuple(DIRECTIONS), goal_distance: float = 0.08,
                 success_radius: float = 0.03, start_noise: float = 0.01, max_steps: int = 16,
                 max_speed: float = 0.25, control_dt: float = 0.1, substeps: int = 5, image_size: int = 32):
        import sapien  # imported here: the rest of rlfarm does not need SAPIEN installed

        unknown = set(directions) - set(DIRECTIONS)
        if unknown or not directions:
            raise ValueError(f"directions must be a non-empty subset of {sorted(DIRECTIONS)}, got {directions}")
        self.directions = tuple(directions)
        self.goal_distance, self.success_radius, self.start_noise = goal_distance, success_radius, start_noise
        self.max_steps, self.max_speed, self.image_size = int(max_steps), float(max_speed), int(image_size)
        self.control_dt, self.substeps = float(control_dt), int(substeps)
        self.scene = sapien.Scene(systems=[sapien.physx.PhysxCpuSystem()])
        self.scene.set_timestep(self.control_dt / self.substeps)
        self.scene.add_ground(0.0, render=False)
        material = sapien.physx.PhysxMaterial(static_friction=0.5, dynamic_friction=0.5, restitution=0.0)
        cube = sapien.ActorBuilder()
        cube.set_scene(self.scene)
        cube.add_box_collision(half_size=[CUBE_HALF] * 3, material=material, density=500.0)
        self.cube = cube.build(name="cube")
        pusher = sapien.ActorBuilder()
        pusher.set_scene(self.scene)
        pusher.add_cylinder_collision(pose=sapien.Pose(q=[0.7071068, 0, 0.7071068, 0]),  # axis x → z: upright
                                      radius=PUSHER_RADIUS, half_length=0.02, material=material)
        self.pusher = pusher.build_kinematic(name="pusher")
        self.pusher_body = self.pusher.find_component_by_type(sapien.physx.PhysxRigidDynamicComponent)
        self._sapien = sapien
        self.observation_space = gym.spaces.Dict({
            "image": gym.spaces.Box(0, 255, (3, image_size, image_size), np.uint8),
            "proprio": gym.spaces.Box(-np.inf, np.inf, (4,), np.float32),
            "state": gym.spaces.Box(-np.inf, np.inf, (6,), np.float32),
            "instruction": gym.spaces.Text(max_length=64, charset=" abcdefghijklmnopqrstuvwxyz"),
        })
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.goal = np.zeros(2)
        self.velocity = np.zeros(2)
        self.steps = 0
        self.instruction = ""

    # -- gymnasium API ---------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        rng = self.np_random
        direction = self.directions[rng.integers(len(self.directions))]
        unit = np.array(DIRECTIONS[direction])
        cube = rng.uniform(-self.start_noise, self.start_noise, 2)
        self.goal = cube + unit * self.goal_distance
        gap = CUBE_HALF + PUSHER_RADIUS + 0.005
        pusher = cube - unit * gap + rng.uniform(-self.start_noise, self.start_noise, 2) * np.abs(unit[::-1])
        self.cube.set_pose(self._sapien.Pose([cube[0], cube[1], CUBE_HALF]))
        body = self.cube.find_component_by_type(self._sapien.physx.PhysxRigidDynamicComponent)
        body.set_linear_velocity([0, 0, 0])
        body.set_angular_velocity([0, 0, 0])
        self.pusher.set_pose(self._sapien.Pose([pusher[0], pusher[1], 0.021]))
        self.pusher_body.set_kinematic_target(self.pusher.get_pose())
        self.velocity = np.zeros(2)
        self.steps = 0
        self.instruction = TEMPLATES[rng.integers(len(TEMPLATES))].format(direction)
        return self._obs(), {"success": False, "direction": direction}

    def step(self, action):
        self.velocity = np.clip(np.asarray(action, np.float64), -1.0, 1.0) * self.max_speed
        dt = self.control_dt / self.substeps
        for _ in range(self.substeps):  # kinematic targets, not teleports: the pusher sweeps and pushes
            pose = self.pusher.get_pose()
            target = pose.p + np.array([self.velocity[0] * dt, self.velocity[1] * dt, 0.0])
            self.pusher_body.set_kinematic_target(self._sapien.Pose(target, pose.q))
            self.scene.step()
        self.steps += 1
        success = bool(np.linalg.norm(self._cube_xy() - self.goal) <= self.success_radius)
        truncated = not success and self.steps >= self.max_steps
        return self._obs(), float(success), success, truncated, {"success": success}

    # -- observations ----------------------------------------------------------------------------------
    def _cube_xy(self) -> np.ndarray:
        return np.asarray(self.cube.get_pose().p[:2], np.float64)

    def _obs(self) -> dict:
        pusher, cube = np.asarray(self.pusher.get_pose().p[:2], np.float64), self._cube_xy()
        return {"image": occupancy_image(pusher, cube, self.goal, self.image_size),
                "proprio": np.concatenate([pusher, self.velocity]).astype(np.float32),
                "state": np.concatenate([pusher, cube, self.goal]).astype(np.float32),
                "instruction": self.instruction}

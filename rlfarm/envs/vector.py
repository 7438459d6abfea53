"""A gymnasium vector env that yields transitions safe to store in a replay buffer.

gymnasium 1.x vector envs autoreset one step *after* an episode ends by default (NEXT_STEP), which turns the
following step into a dummy transition. We use SAME_STEP instead: the done sub-env is reset inside `step`, its
true final observation arrives in `infos["final_obs"]` and its step info under `infos["final_info"]`.
`VectorEnv.step` folds that back into a `StepResult` whose `next_obs` is the real next state of every
transition and whose `obs` is what the policy acts on next.

Frames (for pixel reward models) are rendered by a per-env wrapper right after each sub-env step, so the
done env's frame shows its final state, not the reset state. Headless rendering: MuJoCo uses EGL
(`MUJOCO_GL=egl` unless set) with shadows and reflections off; classic-control envs use pygame's dummy
video driver and are resized to `frame_size`. Step + render rates on CPU and GPU machines are in
docs/benchmarks.md.
"""

import difflib
import importlib
import logging
import os
from dataclasses import dataclass

# Headless defaults, set before gymnasium/mujoco/pygame look at them. A user's own setting wins.
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from gymnasium.envs.registration import load_env_creator  # noqa: E402
from gymnasium.vector import AutoresetMode, SyncVectorEnv  # noqa: E402


class UnknownEnvError(ValueError):
    """An env id that gymnasium's registry does not know."""


@dataclass
class StepResult:
    """One vector step. N = num_envs.

    next_obs: [N, *obs_shape] float32, the true next observation of each transition (final obs at episode end).
    obs: [N, *obs_shape] float32, the observation to act on next (the reset obs where an episode ended).
    env_reward: [N] float32, the env's own reward.
    terminated, truncated: [N] bool.
    frames: [N, H, W, 3] uint8 render of the next_obs state, or None when the env renders no frames.
    episode_returns, episode_lengths: env-reward sum and length of each episode that ended this step.
    """

    next_obs: np.ndarray
    obs: np.ndarray
    env_reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    frames: np.ndarray | None
    episode_returns: list[float]
    episode_lengths: list[int]


class VectorEnv:
    """gymnasium vector env that yields correct transitions (handles the autoreset trap).

    env_id: a gymnasium id, optionally "module:Id" to import the registering module first.
    num_envs: sub-envs stepped in this process, seeded seed, seed + 1, ...
    frame_size: render a frame_size × frame_size RGB frame of every next state (None: no rendering).
    kwargs: passed to gymnasium.make (e.g. max_episode_steps).
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int = 1,
        seed: int = 0,
        frame_size: int | None = None,
        kwargs: dict | None = None,
    ):
        spec = _registered_spec(env_id)
        make_kwargs = dict(kwargs or {})
        mujoco = _is_mujoco(spec)
        if mujoco:
            _log_mujoco_warnings()
        if frame_size is not None:
            make_kwargs["render_mode"] = "rgb_array"
            if mujoco:
                # Rendering at the target size directly is far cheaper than resizing a 480×480 frame.
                make_kwargs.update(width=frame_size, height=frame_size)

        def make_one() -> gym.Env:
            env = gym.make(env_id, **make_kwargs)
            if mujoco and frame_size is not None:
                _turn_off_shadows_and_reflections(env.unwrapped.model)
            return env if frame_size is None else _FrameEachStep(env, frame_size, mujoco)

        self._envs = SyncVectorEnv([make_one] * num_envs, autoreset_mode=AutoresetMode.SAME_STEP)
        self.num_envs = num_envs
        self.single_observation_space = self._envs.single_observation_space
        self.single_action_space = self._envs.single_action_space
        self._seed = seed
        self._renders = frame_size is not None
        self._episode_return = np.zeros(num_envs, dtype=np.float64)
        self._episode_length = np.zeros(num_envs, dtype=np.int64)

    def reset(self) -> np.ndarray:
        """Reset every sub-env with its seed. Returns obs [num_envs, *obs_shape] float32."""
        obs, _ = self._envs.reset(seed=self._seed)
        self._episode_return[:] = 0
        self._episode_length[:] = 0
        return np.asarray(obs, dtype=np.float32)

    def step(self, actions: np.ndarray) -> StepResult:
        """Step every sub-env with actions [num_envs, *action_shape]; done sub-envs are reset in the same call."""
        obs, reward, terminated, truncated, infos = self._envs.step(actions)
        obs = np.asarray(obs, dtype=np.float32)
        done = np.logical_or(terminated, truncated)
        done_ids = np.flatnonzero(done)

        next_obs = obs.copy()
        for i in done_ids:
            next_obs[i] = infos["final_obs"][i]

        frames = None
        if self._renders:
            # Sub-envs that did not end report their frame in infos; ended ones under final_info (pre-reset).
            frames = infos["frame"] if "frame" in infos else np.zeros_like(infos["final_info"]["frame"])
            for i in done_ids:
                frames[i] = infos["final_info"]["frame"][i]

        self._episode_return += reward
        self._episode_length += 1
        episode_returns = [float(self._episode_return[i]) for i in done_ids]
        episode_lengths = [int(self._episode_length[i]) for i in done_ids]
        self._episode_return[done] = 0
        self._episode_length[done] = 0

        return StepResult(
            next_obs=next_obs,
            obs=obs,
            env_reward=reward.astype(np.float32),
            terminated=terminated.astype(bool),
            truncated=truncated.astype(bool),
            frames=frames,
            episode_returns=episode_returns,
            episode_lengths=episode_lengths,
        )

    def close(self) -> None:
        self._envs.close()


class _FrameEachStep(gym.Wrapper):
    """Puts a [size, size, 3] uint8 frame of the post-step state into info["frame"].

    Rendering here, inside the sub-env's step, is what makes the frame of a done step show the final state:
    SAME_STEP autoreset resets the sub-env right after this returns.
    """

    def __init__(self, env: gym.Env, size: int, mujoco: bool):
        super().__init__(env)
        self._size = size
        self._mujoco = mujoco

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {**info, "frame": self._frame()}

    def _frame(self) -> np.ndarray:
        if self._mujoco and self.env.unwrapped.mujoco_renderer.viewer is not None:
            # Each sub-env owns a GL context and gymnasium leaves the last-created one current.
            self.env.unwrapped.mujoco_renderer.viewer.make_context_current()
        frame = self.env.render()
        if frame.shape[:2] == (self._size, self._size):
            return frame
        # Area-aware downsampling keeps thin shapes (Pendulum's rod) visible at small sizes.
        chw = torch.from_numpy(np.ascontiguousarray(frame)).permute(2, 0, 1)[None].float()
        resized = F.interpolate(chw, size=(self._size, self._size), mode="bilinear", antialias=True)
        return resized[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8).numpy()


def _turn_off_shadows_and_reflections(model) -> None:
    """Shadow maps and floor reflections dominate render time under software GL and carry no task signal.

    Must run before the first render: MuJoCo sizes the shadow buffer when it creates the render context.
    """
    model.vis.quality.shadowsize = 0
    model.mat_reflectance[:] = 0


def _log_mujoco_warnings() -> None:
    """Send MuJoCo's warnings to Python logging instead of MUJOCO_LOG.TXT in the working directory.

    HalfCheetah-v5's model warns on every load under MuJoCo 4. Process-wide; a handler already set wins.
    """
    import mujoco

    if mujoco.get_mju_user_warning() is None:
        mujoco.set_mju_user_warning(logging.getLogger("mujoco").warning)


def _registered_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    """The registry entry for env_id, or UnknownEnvError naming the closest registered ids."""
    module, _, name = env_id.rpartition(":")
    if module:
        importlib.import_module(module)
    if name in gym.registry:
        return gym.registry[name]
    closest = difflib.get_close_matches(name, list(gym.registry), n=3, cutoff=0.5)
    hint = f" (closest: {', '.join(closest)})" if closest else ""
    raise UnknownEnvError(
        f"unknown env id {env_id!r}{hint}; use env=pendulum|halfcheetah or env.id=<gymnasium id>"
    )


def _is_mujoco(spec: gym.envs.registration.EnvSpec) -> bool:
    creator = spec.entry_point
    if isinstance(creator, str) and "mujoco" not in creator.lower():
        return False  # importing MuJoCo loads its GL backend (EGL): not for envs that do not need it
    from gymnasium.envs.mujoco.mujoco_env import MujocoEnv

    if isinstance(creator, str):
        creator = load_env_creator(creator)
    return isinstance(creator, type) and issubclass(creator, MujocoEnv)

"""Evaluate a trained policy: load a run directory's actor, play episodes, write MP4s. No Hydra, no Ray.

Each episode gets its own one-env `VectorEnv` seeded `seed + i`, so episode i is the same whether or not it is
filmed or scored, and `episodes=3` reproduces the first three episodes of `episodes=10`. Frames are the
post-step renders that training uses (the done step shows the final state), so a video has exactly one
frame per step. When the run's reward model reads frames, they come at its `frame_size`; a filmed episode
is rendered at the video size and resized down for the reward model (the same antialiased resize that
training applies to non-MuJoCo envs).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from rlfarm.envs.registry import use_env_modules
from rlfarm.envs.spaces import policy_dims
from rlfarm.envs.vector import VectorEnv
from rlfarm.errors import RlfarmError

CHECKPOINT_CHOICES = ("latest", "final")


@dataclass
class Episode:
    """One evaluation episode. frames: [length, H, W, 3] uint8 when rendered, else None."""

    seed: int
    episode_return: float
    length: int
    env_rewards: np.ndarray
    frames: np.ndarray | None = None
    reward_model_return: float | None = None
    video: str | None = None


@dataclass
class TrainedRun:
    """What evaluation needs from a run directory."""

    dir: Path
    cfg: DictConfig
    checkpoint: Path
    state: dict = field(repr=False)


def find_checkpoint(run_dir: Path, which: str = "latest") -> Path:
    """checkpoints/final.pt for "final", the newest checkpoints/*.pt for "latest", else that file name
    (or path). Raises RlfarmError naming what is there."""
    directory = run_dir / "checkpoints"
    found = sorted(directory.glob("*.pt"), key=lambda p: (p.stat().st_mtime, p.name)) if directory.is_dir() else []
    if not found:
        raise RlfarmError(f"no checkpoint in {directory}",
                          "the run did not finish or ran with run.checkpoint=false; train again, or pick another run_dir")
    if which == "latest":
        return found[-1]
    name = "final.pt" if which == "final" else which
    for candidate in (directory / name, directory / f"{name}.pt", Path(name)):
        if candidate.is_file():
            return candidate
    raise RlfarmError(f"checkpoint '{which}' not found in {directory}",
                      f"use checkpoint=latest|final or one of: {', '.join(p.name for p in found)}")


def check_run_dir(run_dir: str | Path) -> Path:
    """The run directory as a Path, or RlfarmError when it is missing or is not a run directory."""
    path = Path(run_dir).expanduser()
    if not path.exists():
        raise RlfarmError(f"run_dir '{run_dir}' does not exist", "pass run_dir=<a directory written by rlfarm train>")
    if not path.is_dir() or not (path / "config.yaml").is_file():
        runs = sorted(p.parent for p in path.glob("*/config.yaml")) if path.is_dir() else []
        hint = "pass run_dir=<a directory written by rlfarm train>"
        if runs:  # a sweep directory
            count = f"{len(runs)} run{'s' if len(runs) != 1 else ''}"
            hint = f"it holds {count}: pass one, e.g. run_dir={shell_quoted_value(runs[0])}"
        raise RlfarmError(f"'{run_dir}' is not a run directory (no config.yaml)", hint)
    return path


def check_evaluable(run_dir: Path) -> None:
    """RlfarmError in one line when the run's family is not one eval plays (an LLM or VLA run: their scores were
    measured in training; the family record says where)."""
    from rlfarm.families import FAMILIES, current_name

    saved = OmegaConf.load(run_dir / "config.yaml")
    family = FAMILIES.get(current_name(OmegaConf.select(saved, "algo.family", default=None)))
    if family is not None and family.not_evaluated:
        name = OmegaConf.select(saved, "algo.name", default=family.name)
        raise RlfarmError(f"rlfarm eval plays gymnasium policies on their env; {run_dir} is a {name} run "
                          f"({family.name} family), which it does not play", family.not_evaluated)


def shell_quoted_value(path: Path) -> str:
    """A path as a Hydra override value typed in a shell: Hydra sweep dirs hold `,` `=` `[` which Hydra would parse."""
    text = str(path)
    return f"\"'{text}'\"" if any(c in text for c in ",[]{}()=:' ") else text


def load_trained_run(run_dir: str | Path, checkpoint: str = "latest") -> TrainedRun:
    path = check_run_dir(run_dir)
    check_evaluable(path)
    ckpt = find_checkpoint(path, checkpoint)
    try:
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
    except Exception as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise RlfarmError(f"cannot read checkpoint {ckpt}: {reason}", "pick another checkpoint=<file name>") from None
    if "actor" not in state.get("agent", {}):
        raise RlfarmError(f"checkpoint {ckpt} holds no actor weights (agent.actor)",
                          "evaluate a checkpoint written by rlfarm train")
    cfg = OmegaConf.load(path / "config.yaml")
    use_env_modules(OmegaConf.select(cfg, "env.imports"))  # the modules that register the run's env (env.imports)
    return TrainedRun(path, cfg, ckpt, state)


def build_actor(cfg: DictConfig, actor_state: dict, env_cfg: DictConfig) -> torch.nn.Module:
    """The run's actor network with its trained weights, for the env's spaces."""
    env = VectorEnv(env_cfg.id, 1, 0, None, env_kwargs(env_cfg))
    dims = policy_dims(env.single_observation_space, env.single_action_space)  # Box or Discrete actions
    env.close()
    actor = instantiate(cfg.model.actor)(dims["obs_dim"], dims["act_dim"], dims["action_low"], dims["action_high"])
    actor.load_state_dict(actor_state)
    return actor.eval()


def env_kwargs(env_cfg: DictConfig) -> dict:
    kwargs = env_cfg.get("kwargs")
    return dict(OmegaConf.to_container(kwargs, resolve=True)) if kwargs else {}


def play_episode(actor: torch.nn.Module, env_cfg: DictConfig, seed: int, deterministic: bool = True,
                 frame_size: int | None = None) -> Episode:
    """One episode in a fresh env seeded `seed`; frames [length, frame_size, frame_size, 3] when frame_size."""
    env = VectorEnv(env_cfg.id, 1, seed, frame_size, env_kwargs(env_cfg))
    try:
        obs = env.reset()
        rewards, frames = [], []
        while True:
            with torch.no_grad():
                action = actor.act(torch.as_tensor(obs).reshape(1, -1), deterministic=deterministic)
            step = env.step(action.numpy())
            rewards.append(float(step.env_reward[0]))
            if step.frames is not None:
                frames.append(step.frames[0].copy())
            if step.episode_returns:
                return Episode(seed, step.episode_returns[0], step.episode_lengths[0],
                               np.asarray(rewards, dtype=np.float32), np.stack(frames) if frames else None)
            obs = step.obs
    finally:
        env.close()


def resize_frames(frames: np.ndarray, size: int) -> np.ndarray:
    """[n, H, W, 3] uint8 → [n, size, size, 3] uint8, antialiased bilinear (as the env's frame wrapper)."""
    if frames.shape[1:3] == (size, size):
        return frames
    nchw = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float()
    resized = F.interpolate(nchw, size=(size, size), mode="bilinear", antialias=True)
    return resized.permute(0, 2, 3, 1).round().clamp(0, 255).to(torch.uint8).numpy()


def score_with_reward_model(model, episode: Episode) -> float:
    """Sum of the run's reward model over the episode (batch keys: the model's `needs`)."""
    batch: dict[str, np.ndarray] = {}
    for key in model.needs:
        if key == "env_reward":
            batch[key] = episode.env_rewards
        elif key == "frames":
            batch[key] = stack_frames(resize_frames(episode.frames, int(model.frame_size)),
                                      int(getattr(model, "frame_stack", 1)))
        else:
            raise RlfarmError(f"reward model needs '{key}', which evaluation does not record",
                              "evaluate with reward=false")
    rewards = np.asarray(model(batch), dtype=np.float64)
    return float(rewards.sum())


def stack_frames(frames: np.ndarray, k: int) -> np.ndarray:
    """[n, S, S, 3] consecutive frames → [n, S, S, 3k]: each with the k - 1 before it, oldest first. The first
    frames repeat the episode's first (training's runners use the reset state's render there, not filmed here)."""
    if k == 1:
        return frames
    padded = np.concatenate([frames[:1]] * (k - 1) + [frames])
    return np.concatenate([padded[i : i + len(frames)] for i in range(k)], axis=-1)


def write_video(path: Path, frames: np.ndarray, fps: float) -> Path:
    """frames [n, H, W, 3] uint8 → H.264 MP4 (imageio-ffmpeg's bundled ffmpeg)."""
    import imageio.v2 as imageio

    path.parent.mkdir(parents=True, exist_ok=True)
    # macro_block_size=1: keep the frame size as is (sizes are even, which yuv420p needs); no silent resize.
    with imageio.get_writer(path, fps=fps, codec="libx264", quality=7, macro_block_size=1,
                            ffmpeg_log_level="error") as writer:
        for frame in frames:
            writer.append_data(frame)
    return path


def render_fps(env_cfg: DictConfig) -> float:
    """The env's own playback rate (metadata render_fps; MuJoCo sets it from dt), 30 when it names none."""
    import gymnasium as gym

    env = gym.make(env_cfg.id, **env_kwargs(env_cfg))
    try:
        fps = env.metadata.get("render_fps") or env.unwrapped.metadata.get("render_fps")
    finally:
        env.close()
    return float(fps) if fps else 30.0


def summarize(values: list[float]) -> tuple[float, float]:
    """(mean, population std)."""
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))

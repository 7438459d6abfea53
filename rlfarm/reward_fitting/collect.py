"""Frames and their labels for fitting a reward model: from an env stepped by a policy, or from a user's file.

The frames pair with labels exactly as the training runners pair them (rlfarm/envs/vector.py): the frame
rendered after a step (before a done sub-env resets) with that step's env reward, so a model fitted here
scores the frames the labelers will see. Each frame carries its episode's number, so the fit can hold out
whole episodes (frames of one episode are near-duplicates; a random split would flatter the held-out error).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rlfarm.errors import RlfarmError


@dataclass
class LabeledFrames:
    """frames [n, S, S, 3k] uint8 (k renders, oldest first); targets [n] float32 (what the model learns); env_reward [n] float32 (NaN for
    a user's file); episode [n] int64 (which episode each frame comes from)."""

    frames: np.ndarray
    targets: np.ndarray
    env_reward: np.ndarray
    episode: np.ndarray

    def __len__(self) -> int:
        return len(self.targets)


def collect(env_id: str, env_kwargs: dict, count: int, frame_size: int, target: str, actor=None, num_envs: int = 8,
            seed: int = 0, frame_stack: int = 1) -> LabeledFrames:
    """Step `num_envs` copies of the env (seeded seed, seed + 1, ...) until `count` frames are rendered; with
    frame_stack k each frame holds the sub-env's last k renders, the reset state's repeated at an episode's start
    (as the runners stack them).
    actor: a policy with `act(obs [n, obs_dim]) -> actions` (the mean action), or None for uniform random actions.
    target: "env_reward", or "success" (the step's info["success"] / info["is_success"], as 0/1)."""
    from rlfarm.envs.rendering import make_env, render_frame

    envs = [make_env(env_id, frame_size, env_kwargs) for _ in range(num_envs)]
    rng = np.random.default_rng(seed)
    frames = np.empty((count, frame_size, frame_size, 3 * frame_stack), np.uint8)
    env_reward, success = np.empty(count, np.float32), np.full(count, np.nan, np.float32)
    episode = np.empty(count, np.int64)
    try:
        obs = [env.reset(seed=seed + j)[0] for j, env in enumerate(envs)]
        # each sub-env's last frame_stack renders, oldest first, on the channels
        history = [np.concatenate([render_frame(env, frame_size)] * frame_stack, axis=-1) for env in envs]
        episode_of = list(range(num_envs))  # sub-env j is in episode episode_of[j]
        next_episode, n = num_envs, 0
        space = envs[0].action_space
        while n < count:
            actions = _actions(actor, obs, space, rng)
            for j, env in enumerate(envs):
                if n == count:
                    break
                obs[j], reward, terminated, truncated, info = env.step(actions[j])
                history[j] = np.concatenate([history[j][..., 3:], render_frame(env, frame_size)], axis=-1)
                frames[n] = history[j]
                env_reward[n], episode[n] = reward, episode_of[j]
                flag = info.get("success", info.get("is_success"))
                if flag is not None:
                    success[n] = float(bool(np.asarray(flag).any()))
                n += 1
                if terminated or truncated:
                    obs[j], _ = env.reset()
                    history[j] = np.concatenate([render_frame(env, frame_size)] * frame_stack, axis=-1)
                    episode_of[j], next_episode = next_episode, next_episode + 1
    finally:
        for env in envs:
            env.close()
    if target == "success":
        if np.isnan(success).all():
            raise RlfarmError(f"{env_id} reports no success in its step info (info['success'] or info['is_success'])",
                              "fit to target=env_reward, or to your own labels with target=file labels=<file.npz>")
        targets = np.nan_to_num(success, nan=0.0)
    else:
        targets = env_reward.copy()
    return LabeledFrames(frames, targets, env_reward, episode)


def concat_frames(parts: list[LabeledFrames]) -> LabeledFrames:
    """Frames of several collections in one set; episode numbers are kept apart."""
    offsets = np.cumsum([0] + [int(p.episode.max()) + 1 if len(p) else 0 for p in parts[:-1]])
    return LabeledFrames(*(np.concatenate([getattr(p, name) for p in parts]) for name in ("frames", "targets", "env_reward")),
                         np.concatenate([p.episode + offset for p, offset in zip(parts, offsets)]))


def _actions(actor, obs: list[np.ndarray], space, rng: np.random.Generator) -> np.ndarray:
    if actor is None:
        low, high = space.low, space.high
        return rng.uniform(low, high, size=(len(obs), *space.shape)).astype(space.dtype)
    with torch.no_grad():
        batch = torch.as_tensor(np.stack(obs), dtype=torch.float32).reshape(len(obs), -1)
        return actor.act(batch, deterministic=False).numpy()


def load_labels(path: str | Path, frame_size: int, frame_stack: int = 1) -> LabeledFrames:
    """A user's labelled frames: an .npz with `frames` [n, H, W, 3] uint8 and `rewards` [n] (optionally
    `episode` [n], else every frame is its own episode). Frames are resized to frame_size as training renders."""
    from rlfarm.evaluation import resize_frames

    try:
        data = np.load(path)
        frames, rewards = data["frames"], data["rewards"]
    except (OSError, ValueError, KeyError) as error:
        raise RlfarmError(f"cannot read labels {str(path)!r}: {str(error).splitlines()[0] or type(error).__name__}",
                          "pass labels=<an .npz with frames [n, H, W, 3] uint8 and rewards [n]>") from None
    if frames.ndim != 4 or frames.shape[-1] != 3 * frame_stack or frames.dtype != np.uint8 or rewards.shape != (len(frames),):
        raise RlfarmError(f"labels {str(path)!r}: frames {frames.shape} {frames.dtype}, rewards {rewards.shape}",
                          f"frames must be [n, H, W, {3 * frame_stack}] uint8 (frame_stack={frame_stack}) and rewards [n]")
    if len(frames) < 10 or not np.isfinite(rewards).all():
        raise RlfarmError(f"labels {str(path)!r}: need at least 10 frames with finite rewards",
                          "label more frames, or drop the NaN/inf ones")
    episode = data["episode"].astype(np.int64) if "episode" in data else np.arange(len(frames))
    targets = rewards.astype(np.float32)
    return LabeledFrames(resize_frames(frames, frame_size), targets, np.full(len(frames), np.nan, np.float32), episode)

"""Atari 2600 games (ale-py, whose wheels carry the ROMs) with the standard preprocessing, as one gymnasium id.

    env=atari env.kwargs.game=Breakout   →   gym.make("rlfarm.envs.atari:RlfarmAtari-v0", game="Breakout")

The wrappers are the ones the DQN / IMPALA / Sample Factory results use (Machado et al. 2018 for the sticky
actions): ALE v5 with frame skip done by `AtariPreprocessing` (max over the last two frames, up to 30 no-op starts,
grey-scale, 84×84) and `FrameStackObservation` (the last 4 frames, channels first: [4, 84, 84] uint8). Episodic life
is off by default (a lost life does not end the episode; the returns are the game's). Each step is `frame_skip`
emulator frames: env frames = env steps × frame_skip. An episode is cut at 108,000 frames (30 minutes of play).

ale-py is an optional extra (`pip install 'rlfarm[atari]'`); without it this id says so in one line."""
from __future__ import annotations

import difflib

import gymnasium as gym

from rlfarm.errors import RlfarmError

ENV_ID = "RlfarmAtari-v0"
MAX_FRAMES = 108_000


def _ale():
    try:
        import ale_py
    except ImportError:
        raise RlfarmError("env=atari needs ale-py, which is not installed",
                          "pip install 'rlfarm[atari]' (ale-py's wheels carry the game ROMs)") from None
    gym.register_envs(ale_py)
    return ale_py


def check_game(game: str) -> None:
    """An ALE game name (v5), or RlfarmError naming the closest ones."""
    _ale()
    games = sorted(spec.name for spec in gym.registry.values() if spec.namespace == "ALE" and spec.version == 5)
    if game not in games:
        closest = difflib.get_close_matches(game, games, n=3)
        raise RlfarmError(f"unknown Atari game {game!r}" + (f" (closest: {', '.join(closest)})" if closest else ""),
                          "set env.kwargs.game=<an ALE game>, e.g. Pong or Breakout")


def make_atari(game: str = "Pong", frame_skip: int = 4, screen_size: int = 84, frame_stack: int = 4,
               noop_max: int = 30, terminal_on_life_loss: bool = False, repeat_action_probability: float = 0.25,
               full_action_space: bool = False, render_mode: str | None = None) -> gym.Env:
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    check_game(game)
    env = gym.make(f"ALE/{game}-v5", frameskip=1, repeat_action_probability=repeat_action_probability,
                   full_action_space=full_action_space, max_num_frames_per_episode=MAX_FRAMES, render_mode=render_mode)
    env = AtariPreprocessing(env, noop_max=noop_max, frame_skip=frame_skip, screen_size=screen_size,
                             terminal_on_life_loss=terminal_on_life_loss, grayscale_obs=True, scale_obs=False)
    return FrameStackObservation(env, frame_stack)


if ENV_ID not in gym.registry:
    # A string entry point: rlfarm's env maker reads it to tell MuJoCo envs apart without importing MuJoCo (whose
    # GL backend, EGL on a GPU host, is not there for an Atari-only machine).
    gym.register(ENV_ID, entry_point="rlfarm.envs.atari:make_atari")

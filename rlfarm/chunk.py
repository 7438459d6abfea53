"""The env chunk: the batch record of the off-policy family (env runner → labeler → learner). Its fields are
named here once, with their shapes; the runner, the labeler and the learner read which to send from here.

A chunk holds N = steps × envs transitions, step-major (the envs' transitions of step 0 first, then step 1's):
one runner's `steps` vector steps of its `envs` sub-envs. It travels in two parts:
- `ChunkMeta`, a few numbers that go with every call (the labeler's `submit`, the learner's `store`), and that the
  runner keeps until the chunk is acked;
- `Chunk`, the arrays: put in Ray's object store once by the runner (only its ref moves after that), joined
  along N by the labeler with those of the other chunks of a bus, and stored by the learner.

Both are TypedDicts, so at run time a chunk is a plain dict of numpy arrays and its meta a plain dict: Ray
serializes the arrays zero-copy, a labeler concatenates them by field and the learners read them by field, with no
record to build or unpack on the hot path. Each field of `Chunk` says by its annotation who writes it (`STEP`,
`FRAME`, `BEHAVIOUR`, `LABEL`); the field lists below are read off those annotations.

Conventions:
- `next_obs[i]` is the true next observation of transition i (the final observation where an episode ended);
  `obs` of the next step is the reset observation there (SAME_STEP autoreset, rlfarm/envs/vector.py).
- A chunk carries no reward until a labeler adds `reward`. The env's own reward (`env_reward`) travels in every
  chunk whatever the reward model: the learner logs it beside the labeled reward it trains on.
- `truncated` lets a learner bootstrap through time limits (V-trace does); SAC stores `terminated` only.
- Frames stay with the labeler: a learner never gets them.
"""
from __future__ import annotations

from typing import Annotated, TypedDict, get_type_hints

import numpy as np

STEP = "step"            # every chunk: written by the vector env at every step
FRAME = "frame"          # written by the vector env when the reward model needs frames
BEHAVIOUR = "behaviour"  # written by the runner when its learner needs the behaviour policy (an actor-learner)
LABEL = "label"          # written by a labeler


class ChunkMeta(TypedDict, total=False):
    """runner, seq: the chunk's id (a learner stores each id once); seq counts from the runner's `first_seq`.
    incarnation: the runner's restarts when it made the chunk (the driver counts what each incarnation delivered).
    produced_at: time.time() when the runner sent it. policy_version: the version of the weights that acted.
    size: N, its transitions. envs: the runner's sub-envs (N = steps × envs).
    labeled_at, labeled_by: time.time() of labeling and the labeler's (index, incarnation), added by the labeler.
    """

    runner: int
    seq: int
    incarnation: int
    produced_at: float
    policy_version: int
    size: int
    envs: int
    labeled_at: float
    labeled_by: tuple[int, int]


class Chunk(TypedDict, total=False):
    """N transitions (see the module docstring).

    obs, next_obs: [N, *obs_shape] float32 (uint8 for image observations; the networks scale them).
    action: [N, *action_shape] in the action space's dtype (float32 for a Box, int64 for a Discrete).
    env_reward: [N] float32, the env's own reward. terminated, truncated: [N] bool.
    frames: [N, S, S, 3 * frame_stack] uint8 renders of next_obs's state (the frame_stack - 1 before it first).
    logprob: [N] float32 log μ(a|s) of the action under the behaviour policy.
    sampled_action: [N, act_dim] float32, a Box action's raw sample (the env got it clipped; logprob is of this).
    reward: [N] float32, the reward model's label.
    """

    obs: Annotated[np.ndarray, STEP]
    action: Annotated[np.ndarray, STEP]
    next_obs: Annotated[np.ndarray, STEP]
    env_reward: Annotated[np.ndarray, STEP]
    terminated: Annotated[np.ndarray, STEP]
    truncated: Annotated[np.ndarray, STEP]
    frames: Annotated[np.ndarray, FRAME]
    logprob: Annotated[np.ndarray, BEHAVIOUR]
    sampled_action: Annotated[np.ndarray, BEHAVIOUR]
    reward: Annotated[np.ndarray, LABEL]


def fields(*writers: str) -> tuple[str, ...]:
    """The fields of `Chunk` written by any of `writers`, in declaration order."""
    hints = get_type_hints(Chunk, include_extras=True)
    return tuple(name for name, hint in hints.items() if hint.__metadata__[0] in writers)


STEPPED = fields(STEP)                         # what every chunk carries
RECORDED = fields(STEP, FRAME)                 # what a vector env writes (rlfarm.envs.step_buffers.StepBuffers)
LEARNED = fields(STEP, BEHAVIOUR, LABEL)       # what a labeler sends on to the learner


def flat(rows: np.ndarray) -> np.ndarray:
    """[steps, envs, ...] → [steps * envs, ...], step-major, without a copy (the step buffers are contiguous per step)."""
    return rows.reshape(-1, *rows.shape[2:])

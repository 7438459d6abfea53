"""Rewards of a generated `Rollout`: each completion decoded up to its stop token, then scored by a rule
verifier (`rlfarm.rewards.verifiers`) against the reference answer of its prompt."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlfarm.data import Rollout, StopIds


def score_rollout(rollout: Rollout, answers: list[str], tokenizer, verifier: Callable, eos_id: StopIds) -> np.ndarray:
    """Rewards [N] for the N samples; answers [num_prompts] holds one reference per prompt."""
    completions = [tokenizer.decode(ids) for ids in rollout.completion_ids(eos_id)]
    return verifier(completions, [answer for answer in answers for _ in range(rollout.group_size)])

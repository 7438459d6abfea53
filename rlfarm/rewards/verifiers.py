"""Rule-based verifiers: (completions, reference answers) → rewards in [0, 1], one float32 per pair.

Each takes two equal-length sequences of strings and returns np.ndarray[float32] of that length.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

import numpy as np

# An optionally signed integer or decimal, with optional thousands separators ("1,234.5").
_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")


def _check_pairs(completions: Sequence[str], answers: Sequence[str]) -> None:
    if len(completions) != len(answers):
        raise ValueError(f"{len(completions)} completions but {len(answers)} answers")


def exact_match(completions: Sequence[str], answers: Sequence[str]) -> np.ndarray:
    """1 where the completion equals the answer, surrounding whitespace ignored."""
    _check_pairs(completions, answers)
    return np.array([c.strip() == a.strip() for c, a in zip(completions, answers)], dtype=np.float32)


def _last_number(text: str) -> float | None:
    matches = _NUMBER.findall(text)
    return float(matches[-1].replace(",", "")) if matches else None


def last_number(completions: Sequence[str], answers: Sequence[str]) -> np.ndarray:
    """1 where the last number in the completion equals the last number in the answer, numerically.

    GSM8K answers end in "#### 72", so their last number is the final answer; "72.0" and "72" match.
    """
    _check_pairs(completions, answers)
    rewards = np.zeros(len(answers), dtype=np.float32)
    for i, (completion, answer) in enumerate(zip(completions, answers)):
        got, want = _last_number(completion), _last_number(answer)
        rewards[i] = got is not None and want is not None and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9)
    return rewards


def partial_credit(completions: Sequence[str], answers: Sequence[str]) -> np.ndarray:
    """Fraction of character positions equal, over the longer of completion and answer.

    Dividing by the longer length makes a completion that runs on past the answer lose credit, so the
    policy also learns where to stop.
    """
    _check_pairs(completions, answers)
    rewards = np.zeros(len(answers), dtype=np.float32)
    for i, (completion, answer) in enumerate(zip(completions, answers)):
        length = max(len(completion), len(answer))
        if length:
            rewards[i] = sum(c == a for c, a in zip(completion, answer)) / length
        else:
            rewards[i] = 1.0
    return rewards


VERIFIERS: dict[str, Callable[[Sequence[str], Sequence[str]], np.ndarray]] = {
    "exact_match": exact_match, "last_number": last_number, "partial_credit": partial_credit,
}


def get_verifier(name: str) -> Callable[[Sequence[str], Sequence[str]], np.ndarray]:
    if name not in VERIFIERS:
        raise KeyError(f"unknown verifier {name!r}; known: {', '.join(VERIFIERS)}")
    return VERIFIERS[name]

"""The synthetic length model — a SPEED-RUN setting, never a training one.

Random weights almost never emit an end token, so a speed run on a real shape (Qwen2.5-1.5B/7B with random
weights) would decode every sample to the cap, which is not what RL for reasoning looks like: most answers end
early and a few run to the cap. With this model each sample ends at a length drawn from a log-normal
distribution whose median and 99th percentile are fractions of the cap (default: a third of the cap, and the
cap), clipped to [1, cap]; the decoder forces the sample's end token there (its log-prob is that token's under
the policy, as for any sampled token). Real models and the learning tests stop on their own end token.

The length of a sample is a function of (the call's seed, the sample's index in the step) only, so it does not
depend on batching or refill: a fixed batch and a refilling decoder see the same lengths.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rlfarm.engines.noise import sample_uniforms

P99_Z = 2.3263478740408408  # the standard normal's 99th percentile
LENGTH_STREAM = 1  # `sample_uniforms` salt: the lengths' stream, apart from the tokens'


@dataclass(frozen=True)
class SyntheticLengths:
    """median_frac, p99_frac: the log-normal's median and 99th percentile as fractions of the cap."""

    median_frac: float = 1 / 3
    p99_frac: float = 1.0

    def __post_init__(self):
        if not 0 < self.median_frac < self.p99_frac:
            raise ValueError(f"synthetic lengths need 0 < median_frac < p99_frac, got median_frac="
                             f"{self.median_frac}, p99_frac={self.p99_frac}")

    @property
    def sigma(self) -> float:
        return math.log(self.p99_frac / self.median_frac) / P99_Z

    def draw(self, seed: int, sample_ids: torch.Tensor, cap: int) -> torch.Tensor:
        """The length of each sample (int64, in [1, cap]) for a call of seed `seed`."""
        normal = torch.special.ndtri(sample_uniforms(seed, sample_ids, LENGTH_STREAM).double())
        lengths = torch.exp(math.log(self.median_frac * cap) + self.sigma * normal).round()
        return lengths.clamp(1, cap).long()


def synthetic_lengths(setting) -> SyntheticLengths | None:
    """A config value (None / false: off; a mapping {median_frac, p99_frac}; true: the defaults) → the model."""
    if setting is None or setting is False:
        return None
    if setting is True:
        return SyntheticLengths()
    if isinstance(setting, SyntheticLengths):
        return setting
    return SyntheticLengths(**dict(setting))

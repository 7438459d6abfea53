"""Counter-based sampling noise: the random numbers of a sample depend on (the call's seed, the sample's index in
the step, the token's index in the sample) only — not on which batch row (slot) the sample runs in, how many
rows run beside it, or when it started. So a decoder may refill a finished row with a queued sample, shrink its
batch, or split a step across engines (`rlfarm.engines.sampling.Rows`), and the same seed still gives the same
samples, as far as the arithmetic of the forward allows.

A stateful generator cannot give that (its stream is consumed in batch order), so the numbers are hashes of the
counters: 32-bit integer mixing held in int64 tensors (every product stays below 2^63), elementwise and
without host syncs, so a CUDA graph captures it and torch.compile fuses it into the sampling kernel.
"""
from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B9  # spreads consecutive vocabulary ids over the 32 bits before mixing


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finalizer (xor-shift-multiply, both multipliers < 2^31 so int64 never overflows)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & MASK32
    x = x ^ (x >> 15)
    x = (x * 0x5BD1E995) & MASK32
    return x ^ (x >> 16)


def row_keys(seed: torch.Tensor, sample_ids: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """One 32-bit key per (seed, sample, token index). seed [1] or [], sample_ids and steps [B] int64 → [B]."""
    sample_key = mix32((seed & MASK32) ^ mix32(sample_ids & MASK32))
    return mix32((sample_key + steps) & MASK32)


def uniforms(keys: torch.Tensor) -> torch.Tensor:
    """Keys (any shape, int64 in [0, 2^32)) → float32 uniforms in (0, 1), 24 bits each (exact in float32)."""
    return ((keys >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def column_keys(vocab: int, device: torch.device | str) -> torch.Tensor:
    """One 32-bit key per vocabulary id [vocab] int64. Made once, outside any compiled graph: inside one, inductor
    folds `arange * GOLDEN` into its int32 index arithmetic, which cannot hold the product (Triton refuses the
    constant, or the product wraps and the noise differs from the CPU's)."""
    return mix32((torch.arange(vocab, dtype=torch.long, device=device) * GOLDEN) & MASK32)


def race_noise(seed: torch.Tensor, sample_ids: torch.Tensor, steps: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """Exp(1) noise [B, vocab] for the exponential race of `rlfarm.engines.sampling.sample_tokens`: row b is the
    noise of token `steps[b]` of sample `sample_ids[b]` under `seed`; `columns` = `column_keys(vocab, device)`."""
    element = mix32(row_keys(seed, sample_ids, steps)[:, None] ^ columns[None, :])
    return -torch.log(uniforms(element))


def sample_uniforms(seed: int, sample_ids: torch.Tensor, salt: int) -> torch.Tensor:
    """One uniform in (0, 1) per sample, from a stream apart from the tokens' (`salt` picks the stream): e.g. the
    length the synthetic length model gives a sample."""
    seed_tensor = torch.tensor(seed, dtype=torch.long, device=sample_ids.device)
    return uniforms(row_keys(seed_tensor, sample_ids, torch.full_like(sample_ids, -1 - salt) & MASK32))

"""Token sampling shared by the engines: no host syncs, and the log-probability convention of
`rlfarm.data` (log softmax(logits / temperature) of the sampled token, before nucleus truncation)."""
from __future__ import annotations

from typing import NamedTuple

import torch

from rlfarm.models.lm import tempered_log_softmax


class Rows(NamedTuple):
    """Where one engine's samples sit in a step that several engines split (samples first … first + B − 1 of
    the step's `total`). A sample's noise is keyed by its index in the step (`rlfarm.engines.noise`), and each
    engine draws one seed per call from its generator, so from the same generator state N engines give what one
    would, at every step."""
    first: int
    total: int


def nucleus_filter(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """Set to −inf the log-probs outside the smallest set of top tokens whose mass reaches top_p. [N, V]."""
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    sorted_p = sorted_logp.exp()
    outside_sorted = sorted_p.cumsum(dim=-1) - sorted_p >= top_p  # mass before it already reaches top_p
    outside = torch.zeros_like(outside_sorted).scatter(-1, order, outside_sorted)
    return logp.masked_fill(outside, float("-inf"))


def sample_tokens(logits: torch.Tensor, temperature: float, top_p: float = 1.0,
                  generator: torch.Generator | None = None,
                  race: torch.Tensor | None = None, force: torch.Tensor | None = None,
                  forced_token: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(token [N], its log-prob [N]) from logits [N, V]. Temperature 0 is greedy, with log-probs at
    temperature 1; otherwise the log-prob is under softmax(logits / temperature) before nucleus filtering.

    Sampling is the exponential race: token = argmax p_i / E_i with E_i ~ Exp(1), which picks i with
    probability p_i and needs no host sync (unlike `torch.multinomial`). `race` [N, V] float32 passes E
    drawn by the caller (`rlfarm.engines.noise.race_noise`); else it is drawn here from `generator`.
    force [N] bool: rows whose token is `forced_token` instead (a synthetic length's end), with its log-prob."""
    logp = tempered_log_softmax(logits, temperature if temperature > 0 else 1.0)
    if temperature == 0:
        token = logp.argmax(dim=-1)
    else:
        sampling_logp = nucleus_filter(logp, top_p) if top_p < 1.0 else logp
        if race is None:
            race = torch.empty_like(logp).exponential_(generator=generator)
        token = (sampling_logp - race.log()).argmax(dim=-1)
    if force is not None:
        token = torch.where(force, forced_token, token)
    return token, logp.gather(-1, token.unsqueeze(-1)).squeeze(-1)

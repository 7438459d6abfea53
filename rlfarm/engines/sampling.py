"""Token sampling shared by the engines: no host syncs, and the log-probability convention of
`rlfarm.data` (log softmax(logits / temperature) of the sampled token, before nucleus truncation)."""
from __future__ import annotations

from typing import NamedTuple

import torch

from rlfarm.models.lm import tempered_log_softmax


class Rows(NamedTuple):
    """Where one engine's samples sit in a step that several engines split (rows first … first + B − 1 of the
    step's `total`). Each engine draws the sampling noise of the whole step and uses its own rows, so a step's
    samples do not depend on how many engines share it: from the same generator state, N engines give what one
    would (each engine's stream then advances by its own number of decode steps).
    The price: each draws total/B times the noise it uses, small next to a decode step's forward."""
    first: int
    total: int

    def race(self, batch: int, vocab: int, generator: torch.Generator | None, device: torch.device
             ) -> torch.Tensor:
        """Exp(1) noise for `sample_tokens`: this engine's `batch` rows of the whole step's [total, V] draw."""
        drawn = torch.empty(max(self.total, batch), vocab, device=device).exponential_(generator=generator)
        return drawn[self.first:self.first + batch]


def nucleus_filter(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """Set to −inf the log-probs outside the smallest set of top tokens whose mass reaches top_p. [N, V]."""
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    sorted_p = sorted_logp.exp()
    outside_sorted = sorted_p.cumsum(dim=-1) - sorted_p >= top_p  # mass before it already reaches top_p
    outside = torch.zeros_like(outside_sorted).scatter(-1, order, outside_sorted)
    return logp.masked_fill(outside, float("-inf"))


def sample_tokens(logits: torch.Tensor, temperature: float, top_p: float = 1.0,
                  generator: torch.Generator | None = None,
                  race: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(token [N], its log-prob [N]) from logits [N, V]. Temperature 0 is greedy, with log-probs at
    temperature 1; otherwise the log-prob is under softmax(logits / temperature) before nucleus filtering.

    Sampling is the exponential race: token = argmax p_i / E_i with E_i ~ Exp(1), which picks i with
    probability p_i and needs no host sync (unlike `torch.multinomial`). `race` [N, V] float32 passes E
    drawn by the caller (a CUDA graph draws it outside the compiled region); else it is drawn here."""
    logp = tempered_log_softmax(logits, temperature if temperature > 0 else 1.0)
    if temperature == 0:
        token = logp.argmax(dim=-1)
    else:
        sampling_logp = nucleus_filter(logp, top_p) if top_p < 1.0 else logp
        if race is None:
            race = torch.empty_like(logp).exponential_(generator=generator)
        token = (sampling_logp - race.log()).argmax(dim=-1)
    return token, logp.gather(-1, token.unsqueeze(-1)).squeeze(-1)

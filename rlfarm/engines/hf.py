"""Built-in generation engine on a Hugging Face causal LM: batched, left-padded prompts, a KV-cached
decoding loop of our own (not `model.generate`), so the log-probability of each sampled token is computed
from the very logits it was sampled from (see `rlfarm.engines.base` for the convention).

Sampling draws Exp(1) noise and takes argmax p_i / E_i (the exponential race, as vLLM does), which picks
token i with probability p_i without the host sync of `torch.multinomial`. End of sequence is tracked on
the device; the host looks at it only every `stop_check_every` steps to stop early.
"""
from __future__ import annotations

import torch
from torch import nn

from rlfarm.engines.base import Engine, Rollout
from rlfarm.models.lm import cache_kwarg, position_ids_from_mask, tempered_log_softmax


def left_pad(sequences: list[list[int]], pad_id: int, device: torch.device | str = "cpu"
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists → (ids [N, L], mask [N, L]) padded on the left, so every row ends at column L − 1."""
    length = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        if sequence:
            ids[row, length - len(sequence):] = torch.tensor(sequence, dtype=torch.long)
            mask[row, length - len(sequence):] = 1
    return ids.to(device), mask.to(device)


def nucleus_filter(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """Set to −inf the log-probs outside the smallest set of top tokens whose mass reaches top_p. [N, V]."""
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    sorted_p = sorted_logp.exp()
    outside_sorted = sorted_p.cumsum(dim=-1) - sorted_p >= top_p  # mass before it already reaches top_p
    outside = torch.zeros_like(outside_sorted).scatter(-1, order, outside_sorted)
    return logp.masked_fill(outside, float("-inf"))


def sample_tokens(logits: torch.Tensor, temperature: float, top_p: float = 1.0,
                  generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(token [N], its log-prob [N]) from logits [N, V]. Temperature 0 is greedy, with log-probs at
    temperature 1; otherwise the log-prob is under softmax(logits / temperature) before nucleus filtering."""
    logp = tempered_log_softmax(logits, temperature if temperature > 0 else 1.0)
    if temperature == 0:
        token = logp.argmax(dim=-1)
    else:
        sampling_logp = nucleus_filter(logp, top_p) if top_p < 1.0 else logp
        race = torch.empty_like(logp).exponential_(generator=generator)
        token = (sampling_logp - race.log()).argmax(dim=-1)
    return token, logp.gather(-1, token.unsqueeze(-1)).squeeze(-1)


class HFEngine(Engine):
    """Generates with its own copy of the policy; `update_weights` copies new tensors into it in place."""

    def __init__(self, model: nn.Module, pad_id: int, device: torch.device | str = "cpu", seed: int = 0,
                 stop_check_every: int = 4):
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.pad_id, self.stop_check_every = pad_id, stop_check_every
        self.weight_version = 0
        self._cache_kwarg = cache_kwarg(model)
        self._generator = torch.Generator(device=self.device).manual_seed(seed)

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], n: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, eos_id: int | None = None) -> Rollout:
        if max_new_tokens < 1 or n < 1:
            raise ValueError(f"need n >= 1 and max_new_tokens >= 1, got n={n}, max_new_tokens={max_new_tokens}")
        from transformers import DynamicCache

        prompt, prompt_mask = left_pad([list(p) for p in prompt_ids for _ in range(n)], self.pad_id, self.device)
        samples, prompt_len = prompt.shape
        attention = torch.zeros((samples, prompt_len + max_new_tokens), dtype=torch.long, device=self.device)
        attention[:, :prompt_len] = prompt_mask
        first_position = prompt_mask.sum(dim=1, keepdim=True)
        tokens = torch.full((samples, max_new_tokens), self.pad_id, dtype=torch.long, device=self.device)
        logprobs = torch.zeros((samples, max_new_tokens), dtype=torch.float32, device=self.device)
        generated = torch.zeros((samples, max_new_tokens), dtype=torch.bool, device=self.device)
        finished = torch.zeros(samples, dtype=torch.bool, device=self.device)

        cache = DynamicCache()
        logits = self._next_logits(prompt, prompt_mask, position_ids_from_mask(prompt_mask), cache)
        steps = max_new_tokens
        for t in range(max_new_tokens):
            token, logprob = sample_tokens(logits, temperature, top_p, self._generator)
            generated[:, t] = ~finished
            tokens[:, t] = token.masked_fill(finished, self.pad_id)
            logprobs[:, t] = logprob.masked_fill(finished, 0.0)
            if eos_id is not None:
                finished = finished | (token == eos_id)
            if t + 1 == max_new_tokens or ((t + 1) % self.stop_check_every == 0 and bool(finished.all())):
                steps = t + 1
                break
            attention[:, prompt_len + t] = generated[:, t]
            logits = self._next_logits(tokens[:, t:t + 1], attention[:, :prompt_len + t + 1],
                                       first_position + t, cache)

        return Rollout(prompt_ids=prompt.cpu(), prompt_mask=prompt_mask.cpu(),
                       response_ids=tokens[:, :steps].cpu(), response_mask=generated[:, :steps].long().cpu(),
                       logprobs=logprobs[:, :steps].cpu(), group_size=n,
                       temperature=temperature if temperature > 0 else 1.0, weight_version=self.weight_version)

    def _next_logits(self, input_ids, attention_mask, position_ids, cache) -> torch.Tensor:
        output = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=True, logits_to_keep=1, **{self._cache_kwarg: cache})
        return output.logits[:, -1]

    @torch.no_grad()
    def update_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        own = dict(self.model.named_parameters()) | dict(self.model.named_buffers())
        unknown = [name for name in state_dict if name not in own]
        if unknown:
            raise KeyError(f"engine model has no tensor {unknown[0]!r} ({len(unknown)} unknown names)")
        for name, tensor in state_dict.items():
            own[name].copy_(tensor)
        self.weight_version = version

    def sleep(self) -> None:
        self.model.to("cpu")
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def wake(self) -> None:
        self.model.to(self.device)

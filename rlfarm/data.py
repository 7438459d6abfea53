"""Plain data that crosses stage boundaries of the on-policy LLM family: the `Rollout` an engine returns.

Log-probability convention (all engines): `Rollout.logprobs[i, t]` is log p(token | prefix) under the
distribution the token was sampled from before nucleus truncation, softmax(logits / temperature), and
`Rollout.temperature` records that temperature (1.0 for greedy decoding, which samples from no
distribution). The learner recomputes its log-probabilities at the same temperature
(`rlfarm.models.lm.sequence_logprobs(..., temperature=rollout.temperature)`), so the ratio
π_θ / π_old is a true importance ratio of the sampling policy.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

# What ends a sample: one token id, several (instruct models stop at `<|im_end|>` or `<|endoftext|>`), or none.
StopIds = int | Sequence[int] | None


def stop_ids(eos: StopIds) -> tuple[int, ...]:
    """The stop ids as a sorted tuple (hashable: decoders key their captured graphs by it); () = never stop."""
    if eos is None:
        return ()
    return (int(eos),) if isinstance(eos, int) else tuple(sorted({int(i) for i in eos}))


@dataclass(frozen=True)
class Rollout:
    """N = num_prompts × group_size samples, prompt-major (the group_size samples of prompt 0 first).

    prompt_ids, prompt_mask: [N, P] left-padded prompts (each repeated per sample) and their mask.
    response_ids, response_mask: [N, T] generated tokens, padded on the right; the mask is 1 for every
        generated token up to and including EOS.
    logprobs: [N, T] float32 log-probabilities of the generated tokens (see the module docstring), 0 on padding.
    weight_version: the oldest version of the weights that sampled any token here (staleness is measured from it).
    token_versions: [N, T] int64, the version of the weights whose logits each token was sampled from (its
        log-prob is under them): a partial rollout's samples span the versions loaded while they were generated.
        None: every token is `weight_version`'s. Values on padding are meaningless.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    logprobs: torch.Tensor
    group_size: int
    temperature: float
    weight_version: int
    token_versions: torch.Tensor | None = None

    @property
    def num_prompts(self) -> int:
        return self.response_ids.shape[0] // self.group_size

    def input_ids(self) -> torch.Tensor:
        """[N, P + T]: what the learner feeds the model to score the responses."""
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    def versions(self) -> torch.Tensor:
        """[N, T] int64: each token's weight version (`token_versions`, or `weight_version` everywhere)."""
        if self.token_versions is not None:
            return self.token_versions
        return torch.full(self.response_ids.shape, self.weight_version, dtype=torch.long)

    def completion_ids(self, eos_id: StopIds = None) -> list[list[int]]:
        """Each sample's generated tokens, without padding and without the final stop token."""
        stops = set(stop_ids(eos_id))
        completions = []
        for ids, length in zip(self.response_ids.tolist(), self.response_mask.sum(dim=1).tolist()):
            ids = ids[:int(length)]
            completions.append(ids[:-1] if ids and ids[-1] in stops else ids)
        return completions

    def select_groups(self, keep: torch.Tensor) -> Rollout:
        """The rollout restricted to the prompts (groups) where keep [num_prompts] is True."""
        rows = keep.to(torch.bool).repeat_interleave(self.group_size).to(self.response_ids.device)
        return replace(self, prompt_ids=self.prompt_ids[rows], prompt_mask=self.prompt_mask[rows],
                       response_ids=self.response_ids[rows], response_mask=self.response_mask[rows],
                       logprobs=self.logprobs[rows],
                       token_versions=None if self.token_versions is None else self.token_versions[rows])


def _pad_columns(tensor: torch.Tensor, width: int, left: bool) -> torch.Tensor:
    """[N, w] → [N, width] with zeros on the left or the right (masked columns: never attended, never scored)."""
    missing = width - tensor.shape[1]
    if missing == 0:
        return tensor
    zeros = tensor.new_zeros(tensor.shape[0], missing)
    return torch.cat([zeros, tensor] if left else [tensor, zeros], dim=1)


def concat_rollouts(parts: Sequence[Rollout]) -> Rollout:
    """The rollouts of several engines as one, in their order (each engine's prompts follow the previous
    one's): prompts re-padded on the left to the longest, responses on the right. Its weight version is the
    oldest part's, so staleness is never understated; token versions are kept where any part has them."""
    if len(parts) == 1:
        return parts[0]
    prompt_len = max(part.prompt_ids.shape[1] for part in parts)
    response_len = max(part.response_ids.shape[1] for part in parts)
    joined = {name: torch.cat([_pad_columns(getattr(part, name), width, left) for part in parts])
              for name, width, left in (("prompt_ids", prompt_len, True), ("prompt_mask", prompt_len, True),
                                        ("response_ids", response_len, False),
                                        ("response_mask", response_len, False), ("logprobs", response_len, False))}
    if any(part.token_versions is not None for part in parts):
        joined["token_versions"] = torch.cat([_pad_columns(part.versions(), response_len, False) for part in parts])
    return replace(parts[0], **joined, weight_version=min(part.weight_version for part in parts))

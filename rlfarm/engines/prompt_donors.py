"""A prompt is run through the model once per `generate` call, whatever the number of its samples (issue 35).

Why: under continuous refill a GRPO group's n samples start at different checks, as slots free up one by one; on the
long-tail workload (256 prompts × 8, 256 slots, cap 1,024) the refill ran 554 prompt forwards for 256 prompts over
342 fills (2.2 per prompt), each eager, each at a check where the decode steps wait for it. But a slot's cache row
keeps its prompt's keys and values in columns [0, P) for as long as no new sample takes the slot: decoding writes
from column P on. So a sample whose prompt some slot still holds starts from a copy of that row's first P columns
(the donor's), and its first token's logits come from the prompt's last hidden state, kept from its forward. On the
same workload that leaves 256 forwards in 220 of the 342 fills (the other 122 fills run no forward at all). vLLM's
prefix caching does the same across requests, by hashed blocks; here the unit is a whole prompt and the scope is one
call, where the slots are already the store.

A copy holds what the forward wrote, so a sample's tokens do not depend on whether its prompt was copied or run
again (beyond the batch composition's rounding, which a second forward would change anyway). New weights mid-call
(partial rollouts) make every donor stale: the prompt is run again under the new weights."""
from __future__ import annotations

import torch


class PromptDonors:
    """For one `generate` call at one weight version: which prompt's keys/values each slot's row holds in [0, P),
    and each prompt's last hidden state (before the final norm), to start more of its samples without a forward."""

    def __init__(self):
        self.prompt_of_slot: dict[int, int] = {}
        self.slots_of: dict[int, set[int]] = {}
        self.last_hidden: dict[int, torch.Tensor] = {}
        self.version: int | None = None
        self.forwards = 0  # prompts run through the model
        self.copies = 0    # samples started from a donor's row

    def at_version(self, version: int) -> None:
        """Weights of `version` run the next prefills: donors of another version no longer match them."""
        if version != self.version:
            self.clear()
            self.version = version

    def clear(self) -> None:
        """Forget every donor (the rows moved, or the weights changed)."""
        self.prompt_of_slot.clear()
        self.slots_of.clear()
        self.last_hidden.clear()

    def split(self, slots: list[int], prompts: list[int]) -> tuple[list[int], list[int]]:
        """Indices into `slots` (and `prompts`, its prompt per slot) of the samples that a donor serves (its slot
        read before this fill writes any row) and of those that need their prompt run."""
        copied = [i for i, prompt in enumerate(prompts) if self.slots_of.get(prompt)]
        fresh = [i for i, prompt in enumerate(prompts) if not self.slots_of.get(prompt)]
        return copied, fresh

    def donor(self, prompt: int) -> int:
        """A slot whose row holds `prompt` (the lowest)."""
        return min(self.slots_of[prompt])

    def serve(self, prompts: list[int]) -> tuple[list[int], torch.Tensor]:
        """For samples of `prompts` that `split` gave to donors: each one's donor slot, and its prompt's last hidden
        state [samples, hidden]."""
        self.copies += len(prompts)
        return [self.donor(p) for p in prompts], torch.stack([self.last_hidden[p] for p in prompts])

    def record(self, slots: list[int], prompts: list[int]) -> None:
        """These slots' rows now hold these prompts."""
        for slot, prompt in zip(slots, prompts):
            old = self.prompt_of_slot.get(slot)
            if old is not None:
                self.slots_of[old].discard(slot)
            self.prompt_of_slot[slot] = prompt
            self.slots_of.setdefault(prompt, set()).add(slot)

    def remember(self, prompts: list[int], last_hidden: torch.Tensor) -> None:
        """The last position's hidden state of each prompt just run ([prompts, hidden])."""
        self.forwards += len(prompts)
        for prompt, hidden in zip(prompts, last_hidden):
            self.last_hidden[prompt] = hidden


def copy_prompt_rows(caches: list[torch.Tensor], targets: torch.Tensor, donors: torch.Tensor,
                     prompt_len: int) -> None:
    """Each cache ([slots, kv heads, columns, head dim]): columns [0, P) of the donor rows into the target rows, the
    rest of the target rows zeroed (stale columns are masked, but 0 × NaN would not be). The donors' columns are
    read whole before any target is written, so a donor may be a target of the same fill."""
    for cache in caches:
        cache[targets, :, :prompt_len] = cache[donors, :, :prompt_len]
        cache[targets, :, prompt_len:] = 0

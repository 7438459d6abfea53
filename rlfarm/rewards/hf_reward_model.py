"""A learned reward: an HF sequence-classification model with one output scores (prompt, completion) text."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


class HFRewardModel:
    """Scores text pairs with `AutoModelForSequenceClassification` (one logit = the reward).

    model: local directory or hub id holding both the model and its tokenizer. Pairs are encoded as the
    tokenizer's text pair (prompt, completion), truncated to max_length tokens, longest part first.
    """

    def __init__(self, model: str, max_length: int = 1024, dtype: str = "float32", device: str = "cpu",
                 batch_size: int = 32):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model)
        if self.tokenizer.pad_token is None:  # decoder-only tokenizers often have none; any token will do
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(model, dtype=getattr(torch, dtype))
        if self.model.config.num_labels != 1:
            raise ValueError(f"{model}: a reward model has one output, this one has {self.model.config.num_labels}")
        # Sequence classifiers read the score at the last non-pad token, which they find by this id.
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model.to(device).eval()
        self.device, self.max_length, self.batch_size = torch.device(device), max_length, batch_size

    @torch.no_grad()
    def score(self, prompts: Sequence[str], completions: Sequence[str]) -> np.ndarray:
        """Rewards [N] float32 for N (prompt, completion) pairs."""
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        rewards = []
        for start in range(0, len(prompts), self.batch_size):
            batch = self.tokenizer(list(prompts[start:start + self.batch_size]),
                                   list(completions[start:start + self.batch_size]),
                                   truncation="longest_first", max_length=self.max_length, padding=True,
                                   return_tensors="pt").to(self.device)
            rewards.append(self.model(**batch).logits[:, 0].float().cpu())
        return torch.cat(rewards).numpy() if rewards else np.zeros(0, dtype=np.float32)

"""The critic of token-level PPO (`algo=ppo_lm`): V(prefix) for every response token.

A causal-LM backbone of the policy's architecture and starting weights (built or loaded the same way, without
LoRA: the critic trains in full) with a linear value head in place of the LM head. The head starts at zero, so
the first values are 0 and the first advantages are the rewards themselves.
"""
from __future__ import annotations

import torch
from torch import nn

from rlfarm.models.lm import position_ids_from_mask


class TokenCritic(nn.Module):
    def __init__(self, causal_lm: nn.Module):
        super().__init__()
        self.backbone = causal_lm.base_model  # the transformer without its LM head (Qwen2Model for Qwen2)
        self.head = nn.Linear(int(causal_lm.config.hidden_size), 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_start: int) -> torch.Tensor:
        """Values [B, T] (float32) of the states that chose each response token: the hidden state at position
        P + t − 1 (as `rlfarm.models.lm.sequence_logprobs`). Inputs: left-padded prompts [B, P] + responses [B, T]."""
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                               position_ids=position_ids_from_mask(attention_mask), use_cache=False).last_hidden_state
        return self.head(hidden[:, response_start - 1:-1]).squeeze(-1).float()

"""Causal-LM policies: build a tiny one from a config dict or load one by path / hub id, optionally wrap
it in LoRA, and score response tokens.

`sequence_logprobs` is the one definition of "log-probability of a sampled token" shared by the learner
and the built-in engine (`tempered_log_softmax`), so importance ratios between the
policy that sampled and the policy being trained are exact, not approximately equal.
"""
from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from rlfarm.memory_plan import LOGIT_BUDGET  # the logits' elements at once where the head runs in chunks


def build_causal_lm(config: Mapping[str, Any]) -> nn.Module:
    """A randomly initialized causal LM from a config dict: {"model_type": "qwen2" | "llama" | ..., **fields}."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(config)
    if "model_type" not in fields:
        raise KeyError("a model config needs a 'model_type' (e.g. qwen2, llama)")
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(fields.pop("model_type"), **fields))


def load_causal_lm(name_or_path: str, dtype: str = "float32") -> nn.Module:
    """A pretrained causal LM from a local directory or a hub id."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(name_or_path, dtype=getattr(torch, dtype))


def add_lora(model: nn.Module, r: int = 8, alpha: int = 16,
             target_modules: Iterable[str] = ("q_proj", "v_proj"), dropout: float = 0.0) -> nn.Module:
    """Freeze `model` and add LoRA adapters (peft) on the named linear layers; only adapters train."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=r, lora_alpha=alpha, target_modules=list(target_modules), lora_dropout=dropout,
                        task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def causal_lm(source: str | Mapping[str, Any], dtype: str = "float32",
              lora: Mapping[str, Any] | None = None, recompute: bool = False) -> nn.Module:
    """The policy a config names: `source` is a config dict (built) or a path / hub id (loaded);
    `lora` = {r, alpha, target_modules[, dropout]} adds adapters; `recompute`: activation checkpointing, each
    decoder block's activations recomputed in the backward pass instead of kept (training mode only)."""
    model = (build_causal_lm(source) if isinstance(source, Mapping) else load_causal_lm(source, dtype))
    model = use_scoring_head(model.to(getattr(torch, dtype)))
    if recompute:  # non-reentrant: works with frozen inputs (LoRA) and inside FSDP's units
        enable = getattr(model, "activation_checkpointing_enable", None)  # transformers ≥ 5.2x; older: gradient_...
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return add_lora(model, **lora) if lora else model


def compute_dtype(dtype: str, device: torch.device | str) -> torch.dtype:
    """The dtype a role computes in: `dtype` ("bfloat16", "float16", "float32") on CUDA; CPU runs float32
    (as the reward models do), so CPU runs and their tests keep exact fp32 logprobs."""
    return getattr(torch, dtype) if torch.device(device).type == "cuda" else torch.float32


def autocast_to(device: torch.device, dtype: torch.dtype):
    """Forward passes in `dtype` (from `compute_dtype`) under autocast; float32 runs without it."""
    return torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)


def trainable_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors a learner publishes to engines: the trainable ones (LoRA adapters only, under LoRA).

    Names are the model's own parameter names, so an engine holding the same architecture (LoRA-wrapped
    the same way) loads them with `load_state_dict(..., strict=False)`.
    """
    return {name: param.detach() for name, param in model.named_parameters() if param.requires_grad}


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding: the first real token of each row is position 0. [B, L] → [B, L]."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def cache_kwarg(model: nn.Module) -> str:
    """Name of the KV-cache argument of the model's forward: transformers 5.2x renamed
    `past_key_values` to `cache` (the old name warns, and goes in 5.40)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def tempered_log_softmax(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature) in float32: the sampling distribution. [..., V] → [..., V]."""
    return torch.log_softmax(logits.float() / temperature, dim=-1)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature)[token]. logits [..., V], tokens [...] → [...] float32."""
    return tempered_log_softmax(logits, temperature).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def sequence_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      response_start: int, temperature: float = 1.0, logit_budget: int | None = None
                      ) -> torch.Tensor:
    """Log-probabilities [B, T] (float32) of the response tokens under `model` sampling at `temperature`.
    input_ids, attention_mask: [B, L] = left-padded prompts [B, P] followed by responses [B, T], response_start = P:
    token t of the response is predicted by the logits at position P + t − 1 (values where the mask is 0 are
    meaningless: mask them out). Where the response's logits would pass `logit_budget` elements (`LOGIT_BUDGET`
    unless given) and the model's head is a `ScoringHead`, the head scores the tokens itself, on chunks of tokens
    whose logits are recomputed in the backward pass rather than kept (same values, same gradients). The model's
    own forward runs either way, so DDP's and FSDP's hooks around it do too. `rlfarm.models.packed` scores the same
    tokens without computing the padding."""
    tokens = input_ids[:, response_start:]
    return scored_tokens(model, tokens, temperature, logit_budget, input_ids=input_ids, attention_mask=attention_mask,
                         position_ids=position_ids_from_mask(attention_mask), logits_to_keep=tokens.shape[1] + 1)


def scored_tokens(model: nn.Module, tokens: torch.Tensor, temperature: float, logit_budget: int | None,
                  **inputs: Any) -> torch.Tensor:
    """log π(tokens) [R, T] (float32) from one forward of `model` on `inputs`, whose `logits_to_keep` selects
    positions of which the first T of each row predict `tokens` (whole logits, or the `ScoringHead` in chunks where
    they would pass `logit_budget` elements: see `sequence_logprobs`)."""
    logit_budget = logit_budget or LOGIT_BUDGET
    head = scoring_head(model)
    if head is None or tokens.numel() * head.out_features <= logit_budget:
        logits = model(**inputs, use_cache=False).logits[:, :tokens.shape[1]]
        return token_logprobs(logits, tokens, temperature)
    with head.scoring(tokens, temperature, rows=max(1, logit_budget // head.out_features)):
        return model(**inputs, use_cache=False).logits


class ScoringHead(nn.Linear):
    """An LM head (a plain `nn.Linear` otherwise) that, inside `scoring(tokens, ...)`, returns the log-probabilities
    of `tokens` [B, T] instead of logits: given the hidden states of the T + 1 last positions (the first T predict
    the tokens), it runs on chunks of `rows` tokens, each checkpointed, so at most one chunk's logits exist at once.
    A 152k vocabulary over a micro-batch of 16k tokens would otherwise be ~10 GB of fp32 logits, and ~40 GB with
    their softmax and gradients."""

    _scoring: tuple[torch.Tensor, float, int] | None = None  # (tokens, temperature, rows) inside `scoring`

    @contextlib.contextmanager
    def scoring(self, tokens: torch.Tensor, temperature: float, rows: int) -> Iterator[None]:
        self._scoring = (tokens, temperature, rows)
        try:
            yield
        finally:
            self._scoring = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self._scoring is None:
            return super().forward(hidden)
        tokens, temperature, rows = self._scoring
        return chunked_head_logprobs(self, hidden[:, :tokens.shape[1]], tokens, temperature, rows)


def use_scoring_head(model: nn.Module) -> nn.Module:
    """Make `model`'s LM head a `ScoringHead`, in place: the same module object and parameters (a tied head stays
    tied, names and state dicts are unchanged), only its class differs. A head that is not a plain `nn.Linear`
    (e.g. LoRA-wrapped) is left as it is, and is scored through whole logits."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = getattr(base, "lm_head", None)
    if type(head) is nn.Linear:
        head.__class__ = ScoringHead
    return model


def scoring_head(model: nn.Module) -> ScoringHead | None:
    """The `ScoringHead` of a model, unwrapping DDP and peft (FSDP2 keeps the module itself); None if it has none."""
    head = getattr(base_model(model), "lm_head", None)
    return head if isinstance(head, ScoringHead) else None


def base_model(model: nn.Module) -> nn.Module:
    """The transformers model inside DDP and peft wrappers (FSDP2 keeps the module itself)."""
    base = getattr(model, "module", model)  # DDP
    return base.get_base_model() if hasattr(base, "get_base_model") else base


def decoder_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated transformer blocks: the modules of the classes it names in `_no_split_modules` (e.g.
    Qwen2DecoderLayer), through DDP and peft wrappers, and by class ancestry (FSDP2 makes each sharded block an
    instance of a subclass of its own, FSDPQwen2DecoderLayer)."""
    names = set(getattr(base_model(model), "_no_split_modules", None) or [])
    return [module for module in model.modules() if any(cls.__name__ in names for cls in type(module).__mro__)]


def chunked_head_logprobs(head: nn.Linear, hidden: torch.Tensor, tokens: torch.Tensor, temperature: float,
                          rows: int) -> torch.Tensor:
    """`token_logprobs(head(hidden), tokens)` for hidden [B, T, H], tokens [B, T], `rows` tokens at a time:
    with gradients on, each chunk is checkpointed (its logits recomputed in the backward pass), so at most one
    chunk's logits exist at once."""
    from torch.utils.checkpoint import checkpoint

    flat_hidden, flat_tokens = hidden.reshape(-1, hidden.shape[-1]), tokens.reshape(-1)
    out = []
    for start in range(0, len(flat_tokens), rows):
        args = (head.weight, head.bias, flat_hidden[start:start + rows], flat_tokens[start:start + rows], temperature)
        out.append(checkpoint(_head_logprobs, *args, use_reentrant=False) if torch.is_grad_enabled()
                   else _head_logprobs(*args))
    return torch.cat(out).view_as(tokens)


def _head_logprobs(weight: torch.Tensor, bias: torch.Tensor | None, hidden: torch.Tensor, tokens: torch.Tensor,
                   temperature: float) -> torch.Tensor:
    # the head's weights, not the head: called inside its own forward (and recomputed after it)
    return token_logprobs(nn.functional.linear(hidden, weight, bias), tokens, temperature)

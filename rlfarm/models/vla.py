"""A tiny vision-language-action policy for CPU tests and small tasks.

    image [3, S, S] ─ CNN ─┐
    instruction words ─ embedding, masked mean ─┼─ MLP ─ h ─ head ─ K×D action tokens × `bins` logits
    proprio ─ linear ─┘

Action tokens come out in parallel (one forward pass gives all K×D token distributions, as OpenVLA-OFT's
parallel decoding does) rather than autoregressively, so given the observation the tokens are independent and
the log-probability of a chunk is exactly the sum of its tokens' log-softmax terms: the engine's logprobs and
the learner's are the same function (`token_logprobs`). Temperature divides the logits in both, so π_old and
π are measured at the rollout temperature (SimpleVLA-RL samples at 1.6).

The head may add a bin-position feature (see `bin_features`), which lets neighbouring bins learn together.
With `value_head=True` (PPO with a shared trunk, `algo=ppo_vla`) a linear value head reads the same hidden state, so
one forward gives the action tokens' log-probabilities and V(observation).
The head starts at zero: the first policy samples every bin uniformly, whatever the weights of the encoders,
so a run's starting success rate is that of a uniformly random policy over the action bins.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from rlfarm.models.lm import cache_kwarg

PAD, UNKNOWN = 0, 1


class InstructionTokenizer:
    """Word-level: a fixed vocabulary (the task's instruction words) plus <pad> = 0 and <unk> = 1."""

    def __init__(self, words: Sequence[str], max_words: int = 12):
        self.ids = {word: i + 2 for i, word in enumerate(sorted(set(words)))}
        self.max_words = int(max_words)

    @property
    def vocab_size(self) -> int:
        return len(self.ids) + 2

    def encode(self, instructions: Sequence[str]) -> np.ndarray:
        """[B] strings → [B, max_words] int64 ids, padded with 0 (longer instructions are cut)."""
        out = np.zeros((len(instructions), self.max_words), np.int64)
        for row, text in enumerate(instructions):
            ids = [self.ids.get(word, UNKNOWN) for word in text.lower().split()][: self.max_words]
            out[row, : len(ids)] = ids
        return out


class TinyVLA(nn.Module):
    def __init__(self, vocab: Sequence[str], action_dim: int, chunk_size: int, proprio_dim: int,
                 image_size: int = 32, image_channels: int = 3, bins: int = 256, width: int = 64,
                 max_words: int = 12, proprio_scale: float = 10.0, bin_features: bool = True,
                 value_head: bool = False):
        super().__init__()
        self.tokenizer = InstructionTokenizer(vocab, max_words)
        self.action_dim, self.chunk_size, self.bins = int(action_dim), int(chunk_size), int(bins)
        self.proprio_scale = float(proprio_scale)  # positions are centimetres-scale in metres: bring them to ~1
        self.image = nn.Sequential(
            nn.Conv2d(image_channels, 16, 5, stride=2, padding=2), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(32, 32, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            image_features = self.image(torch.zeros(1, image_channels, image_size, image_size)).shape[1]
        self.image_proj = nn.Linear(image_features, width)
        self.words = nn.Embedding(self.tokenizer.vocab_size, width, padding_idx=PAD)
        self.proprio = nn.Linear(proprio_dim, width)
        # Tanh, not ReLU: zero-centred features. With ReLU the features share a large common part across all
        # observations, the head learned through it as through a bias, and GRPO collapsed every instruction onto
        # whichever direction got ahead first (it acted identically on "left" and "right"); with tanh both
        # directions are learned.
        self.trunk = nn.Sequential(nn.Linear(3 * width, 2 * width), nn.Tanh(), nn.Linear(2 * width, 2 * width),
                                   nn.Tanh())
        self.head = nn.Linear(2 * width, self.num_tokens * self.bins)
        # Bin-position feature: one more output per token weighs the bin's centre c in [-1, 1], so that a single
        # parameter moves mass toward one end of the range. Free per-bin logits alone (OpenVLA's LM head) learn
        # each bin separately: 256 times the samples for the same shift. (A c² term, tried too, narrowed the
        # distribution so fast that GRPO groups went all-or-nothing before the instruction was learned.)
        self.bin_features = bool(bin_features)
        self.shape_head = nn.Linear(2 * width, self.num_tokens) if self.bin_features else None
        centres = (torch.arange(self.bins) + 0.5) / self.bins * 2 - 1
        self.register_buffer("bin_basis", centres[None], persistent=False)  # [1, bins]
        self.value_head = nn.Linear(2 * width, 1) if value_head else None  # V(s) on the trunk PPO shares
        for layer in (self.head, self.shape_head, self.value_head):
            if layer is not None:
                nn.init.zeros_(layer.weight)
                nn.init.zeros_(layer.bias)

    @property
    def num_tokens(self) -> int:
        """Action tokens per policy call: K actions × D dimensions."""
        return self.chunk_size * self.action_dim

    def hidden(self, image: torch.Tensor, words: torch.Tensor, proprio: torch.Tensor) -> torch.Tensor:
        """image uint8 [B, C, S, S], words int64 [B, L], proprio [B, P] → the trunk's features [B, 2·width]."""
        seen = self.image_proj(self.image(image.float() / 255.0))
        mask = (words != PAD).unsqueeze(-1).float()
        said = (self.words(words) * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        felt = self.proprio(proprio.float() * self.proprio_scale)
        return self.trunk(torch.cat([seen, said, felt], dim=-1))

    def _action_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.head(hidden).view(-1, self.num_tokens, self.bins)
        if self.shape_head is not None:
            logits = logits + self.shape_head(hidden).view(-1, self.num_tokens, 1) @ self.bin_basis
        return logits

    def logits(self, image: torch.Tensor, words: torch.Tensor, proprio: torch.Tensor) -> torch.Tensor:
        """→ logits [B, K*D, bins]."""
        return self._action_logits(self.hidden(image, words, proprio))

    def token_logprobs(self, image, words, proprio, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """log π(token) of each given token [B, K*D] at `temperature`; exact (tokens are independent given obs)."""
        return _gather_logprobs(self.logits(image, words, proprio), tokens, temperature)

    def values(self, image, words, proprio) -> torch.Tensor:
        """V(observation) [B] from the value head (built with value_head=True)."""
        return self._value(self.hidden(image, words, proprio))

    def token_logprobs_and_values(self, image, words, proprio, tokens: torch.Tensor, temperature: float = 1.0
                                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """`token_logprobs` and `values` from one pass through the shared trunk."""
        hidden = self.hidden(image, words, proprio)
        return _gather_logprobs(self._action_logits(hidden), tokens, temperature), self._value(hidden)

    def _value(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.value_head is None:
            raise ValueError("this policy has no value head: build it with value_head=True")
        return self.value_head(hidden.float()).squeeze(-1)

    @torch.no_grad()
    def sample(self, image, words, proprio, temperature: float = 1.0, generator: torch.Generator | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens [B, K*D], their logprobs [B, K*D]). temperature 0 takes the most likely bin (greedy)."""
        logits = self.logits(image, words, proprio).float()
        if temperature == 0:
            tokens = logits.argmax(-1)
            return tokens, torch.zeros_like(tokens, dtype=torch.float32)
        logprobs = torch.log_softmax(logits / temperature, dim=-1)
        flat = torch.multinomial(logprobs.exp().view(-1, self.bins), 1, generator=generator)
        tokens = flat.view(logprobs.shape[:2])
        return tokens, logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _gather_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """log-softmax of logits [B, T, bins] at `temperature`, taken at the given tokens [B, T] → [B, T]."""
    logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logprobs.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)


def tiny_vla(vocab: Sequence[str], action_dim: int, chunk_size: int, proprio_dim: int, **config) -> TinyVLA:
    """Build from a config dict (conf/model/tiny_vla.yaml `config`) and the env's shapes."""
    return TinyVLA(vocab, action_dim, chunk_size, proprio_dim, **config)


class HFVLAPolicy(nn.Module):
    """An HF image-text-to-text model (Llava-style; OpenVLA's Prismatic needs remote code) as an action-token
    policy, OpenVLA's way: the last `bins` ids of the vocabulary stand for the action bins, and decoding is
    restricted to them, so a sampled token is always an action and its log-probability is exact under the
    restricted softmax. K×D tokens are decoded autoregressively (each conditioned on the ones before).

    Decoding keeps a KV cache: the picture and prompt go through the model once, then one token per step
    (for OpenVLA's 7 tokens after ~280 prompt tokens, 7 prefix passes become 1). Prompts come as token ids of equal length (image placeholder tokens + instruction); `prompt_mask` marks
    left padding (0), if any.
    """

    def __init__(self, model: nn.Module, num_tokens: int, bins: int = 256):
        super().__init__()
        self.model, self.num_tokens, self.bins = model, int(num_tokens), int(bins)
        vocab = model.get_output_embeddings().weight.shape[0]
        if vocab < bins:
            raise ValueError(f"the model's vocabulary ({vocab}) is smaller than {bins} action bins")
        self.first_action_id = vocab - self.bins
        self._cache_kwarg = cache_kwarg(model)

    def token_logprobs(self, pixel_values, input_ids, tokens: torch.Tensor, temperature: float = 1.0,
                       prompt_mask: torch.Tensor | None = None) -> torch.Tensor:
        """log π of the given action tokens [B, T] (bin indices) after the prompt, teacher-forced in one pass."""
        return self.score(pixel_values, input_ids, tokens, temperature, prompt_mask)[0]

    def score(self, pixel_values, input_ids, tokens: torch.Tensor, temperature: float = 1.0,
              prompt_mask: torch.Tensor | None = None, prompt_hidden: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(`token_logprobs`, and with `prompt_hidden` the last layer's state at the prompt's last token [B, H] —
        what a value head reads: the observation, before any action token — from the same pass)."""
        full = torch.cat([input_ids, tokens.long() + self.first_action_id], dim=1)
        out = self.model(input_ids=full, pixel_values=pixel_values, attention_mask=_extend(prompt_mask, full),
                         logits_to_keep=tokens.shape[1] + 1, output_hidden_states=prompt_hidden)
        logits = out.logits[:, :-1, self.first_action_id:]
        hidden = out.hidden_states[-1][:, input_ids.shape[1] - 1] if prompt_hidden else None  # left-padded prompts
        return _gather_logprobs(logits, tokens, temperature), hidden

    @torch.no_grad()
    def sample(self, pixel_values, input_ids, temperature: float = 1.0, generator: torch.Generator | None = None,
               prompt_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens [B, K*D] as bin indices, their logprobs [B, K*D]); temperature 0 is greedy."""
        from transformers import DynamicCache

        cache, ids, tokens, logprobs = DynamicCache(), input_ids, [], []
        step_input = {"input_ids": input_ids, "pixel_values": pixel_values}  # the picture is read on the first step only
        for _ in range(self.num_tokens):
            out = self.model(**step_input, attention_mask=_extend(prompt_mask, ids), use_cache=True,
                             logits_to_keep=1, **{self._cache_kwarg: cache})
            token, logprob = sample_action_token(out.logits[:, -1, self.first_action_id:], temperature, generator)
            tokens.append(token)
            logprobs.append(logprob)
            step_input = {"input_ids": (token + self.first_action_id).unsqueeze(1)}
            ids = torch.cat([ids, step_input["input_ids"]], dim=1)
        return torch.stack(tokens, 1), torch.stack(logprobs, 1)


def sample_action_token(scores: torch.Tensor, temperature: float, generator: torch.Generator | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step's (token [B], its log-prob [B]) from the action bins' scores [B, bins]: the tempered
    log-softmax the learner's recompute uses; temperature 0 is greedy (log-prob 0)."""
    scores = scores.float()
    if temperature == 0:
        token = scores.argmax(-1)
        return token, torch.zeros_like(token, dtype=torch.float32)
    tempered = torch.log_softmax(scores / temperature, dim=-1)
    token = torch.multinomial(tempered.exp(), 1, generator=generator).squeeze(-1)
    return token, tempered.gather(-1, token.unsqueeze(-1)).squeeze(-1)


def _extend(prompt_mask: torch.Tensor | None, ids: torch.Tensor) -> torch.Tensor:
    """The attention mask of `ids` (prompt + generated): the prompt's own mask, then ones."""
    mask = torch.ones_like(ids)
    if prompt_mask is not None:
        mask[:, :prompt_mask.shape[1]] = prompt_mask
    return mask


def load_hf_vla(path: str, num_tokens: int, bins: int = 256, lora: dict | None = None,
                dtype: torch.dtype | None = None) -> HFVLAPolicy:
    """An image-text-to-text checkpoint saved with `save_pretrained`, by local path (nothing is downloaded
    here), optionally with LoRA adapters (peft: `lora` = LoraConfig keywords, e.g. r, lora_alpha,
    target_modules); only the adapters then train."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype or torch.float32)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(**lora))
    return HFVLAPolicy(model, num_tokens, bins)


class HFVLAActions(nn.Module):
    """An `HFVLAPolicy` behind the interface the VLA roles use (TinyVLA's): `sample` / `token_logprobs` of
    (image uint8 [B, 3, S, S], words int64 [B, L], proprio [B, P]), `tokenizer.encode(instructions)`,
    `num_tokens`. The picture is resized to the vision tower's input and normalized (CLIP statistics unless the
    checkpoint saved an image processor); the prompt is the image placeholder tokens, then the instruction in
    the checkpoint's own tokenizer, left-padded to `max_words` tokens. Proprio is not used (as in OpenVLA)."""

    def __init__(self, policy: HFVLAPolicy, tokenizer, image_token_id: int, image_tokens: int, image_size: int,
                 mean: Sequence[float], std: Sequence[float], max_words: int = 16, value_head: bool = False):
        super().__init__()
        self.policy = policy
        hidden = policy.model.get_output_embeddings().weight.shape[1]
        self.value_head = nn.Linear(hidden, 1) if value_head else None  # outside LoRA's wrapping: always trained
        if self.value_head is not None:
            nn.init.zeros_(self.value_head.weight)
            nn.init.zeros_(self.value_head.bias)
        self.tokenizer = HFInstructionTokenizer(tokenizer, max_words)
        self.image_token_id, self.image_tokens, self.image_size = int(image_token_id), int(image_tokens), int(image_size)
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)

    @property
    def num_tokens(self) -> int:
        return self.policy.num_tokens

    def _inputs(self, image: torch.Tensor, words: torch.Tensor):
        pixels = torch.nn.functional.interpolate(image.float() / 255.0, size=(self.image_size, self.image_size),
                                                 mode="bilinear", align_corners=False)
        pixels = (pixels - self.mean) / self.std
        picture = torch.full((len(words), self.image_tokens), self.image_token_id, dtype=torch.long,
                             device=words.device)
        mask = words != self.tokenizer.pad_id
        ids = torch.cat([picture, words.masked_fill(~mask, self.tokenizer.fill_id)], dim=1)
        prompt_mask = torch.cat([torch.ones_like(picture), mask.long()], dim=1)
        return pixels.to(self.policy.model.dtype), ids, prompt_mask

    def token_logprobs(self, image, words, proprio, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        pixels, ids, mask = self._inputs(image, words)
        return self.policy.token_logprobs(pixels, ids, tokens, temperature, prompt_mask=mask)

    def token_logprobs_and_values(self, image, words, proprio, tokens: torch.Tensor, temperature: float = 1.0
                                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """`token_logprobs` and V(observation) from the value head on the prompt's last hidden state, in one pass."""
        if self.value_head is None:
            raise ValueError("this policy has no value head: build it with value_head=True")
        pixels, ids, mask = self._inputs(image, words)
        logprobs, hidden = self.policy.score(pixels, ids, tokens, temperature, prompt_mask=mask, prompt_hidden=True)
        return logprobs, self.value_head(hidden.float()).squeeze(-1)

    def values(self, image, words, proprio) -> torch.Tensor:
        """V(observation) [B]: the prompt scored with no action token after it."""
        empty = torch.zeros(len(words), 0, dtype=torch.long, device=words.device)
        return self.token_logprobs_and_values(image, words, proprio, empty)[1]

    @torch.no_grad()
    def sample(self, image, words, proprio, temperature: float = 1.0, generator: torch.Generator | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        pixels, ids, mask = self._inputs(image, words)
        return self.policy.sample(pixels, ids, temperature, generator, prompt_mask=mask)


class HFInstructionTokenizer:
    """Instructions → int64 [B, max_words] in an HF tokenizer's ids, left-padded with -1 (no id is -1, so the
    policy tells padding from text without a pad token of the tokenizer's), truncated from the left."""

    pad_id = -1

    def __init__(self, tokenizer, max_words: int):
        self.tokenizer, self.max_words = tokenizer, int(max_words)
        fill = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.fill_id = int(fill or 0)  # what the model is fed at padded (masked) places

    def encode(self, instructions: Sequence[str]) -> np.ndarray:
        out = np.full((len(instructions), self.max_words), self.pad_id, dtype=np.int64)
        for row, text in enumerate(instructions):
            ids = self.tokenizer.encode(text, add_special_tokens=False)[-self.max_words:]
            if ids:
                out[row, -len(ids):] = ids
        return out


CLIP_MEAN, CLIP_STD = (0.4815, 0.4578, 0.4082), (0.2686, 0.2613, 0.2758)


def load_hf_vla_actions(path: str, num_tokens: int, bins: int = 256, lora: dict | None = None,
                        max_words: int = 16, value_head: bool = False) -> HFVLAActions:
    """A Llava-style checkpoint folder (model + tokenizer, optionally an image processor) as a VLA policy."""
    import os

    from transformers import AutoConfig, AutoTokenizer

    if not os.path.isdir(os.path.expanduser(path)):
        raise FileNotFoundError(f"model.source: no such folder '{path}' (nothing is downloaded at run time)")
    config = AutoConfig.from_pretrained(path)
    vision = config.vision_config
    side = int(vision.image_size) // int(vision.patch_size)
    image_tokens = side * side + (1 if getattr(config, "vision_feature_select_strategy", "default") == "full" else 0)
    mean, std = CLIP_MEAN, CLIP_STD
    try:
        from transformers import AutoImageProcessor

        processor = AutoImageProcessor.from_pretrained(path)
        mean, std = processor.image_mean, processor.image_std
    except (OSError, ValueError):  # no image processor saved: CLIP's statistics (Llava's vision towers are CLIP)
        pass
    return HFVLAActions(load_hf_vla(path, num_tokens, bins, lora), AutoTokenizer.from_pretrained(path),
                        config.image_token_id, image_tokens, int(vision.image_size), mean, std, max_words,
                        value_head)

"""A generative vision-language model as the reward: asked a yes/no question about each frame, its answer read off
the next-token distribution of one prefill forward (no decoding), as RL-VLM-F and VLM-judge rewards do.

reward = log p(yes) − log p(no) at the answer position (`score: log_odds`; the softmax's normalizer cancels, so it
is the difference of the two logits), or p(yes) (`score: p_yes`). Every frame of a bus gets the same prompt, so a
sub-batch is one forward of identical token rows, each with its own image: no padding, no per-frame processor call;
the frames stay uint8 until they are on the device, where they are cropped, resized and normalized (as CLIP's).
The prompt's text before the image is a handful of tokens against hundreds of image tokens, so its KV is not
shared across the batch (nothing to gain), and only the last position's logits are computed (`logits_to_keep=1`).

Architecture: LLaVA (`LlavaForConditionalGeneration`: a CLIP vision tower, a projector, any causal LM), loaded by hub
id or save_pretrained folder like `reward=clip`, or built with random weights on the device from a shape name ending
in `_shape` (rlfarm/rewards/vlm_factory.py) for speed runs.
"""
from __future__ import annotations

import os

import numpy as np
import torch

from rlfarm.rewards.base import OnDevice, Pending, RewardModel, RewardModelError
from rlfarm.rewards.clip import _pixel_stats, clip_pixels
from rlfarm.rewards.staging import StagedUpload, as_parts, sub_batches

SCORES = ("log_odds", "p_yes")


def judge_scores(logits: torch.Tensor, yes: int, no: int, score: str) -> torch.Tensor:
    """[n, V] next-token logits → [n] float32: log p(yes) − log p(no) = logit_yes − logit_no, or p(yes)."""
    logits = logits.float()
    if score == "p_yes":
        return logits.softmax(dim=-1)[:, yes]
    return logits[:, yes] - logits[:, no]


class VlmJudgeReward(RewardModel):
    """A VLM's answer to `question` about each rendered frame.

    model: hub id or local save_pretrained folder of a LLaVA-architecture model with its tokenizer (and
        preprocessor_config.json for the pixel statistics; OpenAI CLIP's without one), or a shape name such as
        `qwen2-vl-2b_shape` (random weights built on the device, nothing read from disk).
    template: the prompt, with `{question}` and one `<image>` (the tokenizer's image token) per frame in a stack.
    yes_word, no_word: the answers, one token each in the model's tokenizer (keys `yes`/`no` would be YAML booleans).
    score: log_odds (log p(yes) − log p(no)) or p_yes.
    frame_stack: 2 asks about a pair of renders (before, after the step), for progress questions; the template then
        holds two images.
    max_batch: frames per forward (bounds activation memory: a frame is hundreds of tokens).
    dtype: the weights' dtype on CUDA; CPU runs float32.
    """

    needs = ("frames",)
    takes_parts = ("frames",)

    def __init__(self, model: str, question: str = "Is the cheetah running fast?",
                 template: str = "USER: <image>\n{question} Answer yes or no. ASSISTANT:", yes_word: str = "Yes",
                 no_word: str = "No", score: str = "log_odds", frame_size: int = 224, frame_stack: int = 1,
                 max_batch: int = 32, dtype: str = "bfloat16"):
        if score not in SCORES:
            raise RewardModelError(f"reward.score={score!r} is not a judge score; set reward.score=log_odds or p_yes")
        if template.count("<image>") != frame_stack:
            raise RewardModelError(f"reward.template holds {template.count('<image>')} <image> for frame_stack="
                                   f"{frame_stack}; put one <image> per frame of the stack in reward.template")
        self.model, self.question, self.template = model, question, template
        self.yes_word, self.no_word, self.score = yes_word, no_word, score
        self.frame_size, self.frame_stack, self.max_batch, self.dtype = frame_size, frame_stack, max_batch, dtype
        self._vlm = None

    def setup(self, device: str) -> None:
        self._device = torch.device(device)
        self._dtype = getattr(torch, self.dtype) if self._device.type == "cuda" else torch.float32
        vlm, tokenizer, mean, std = _load(self.model, self._device, self._dtype)
        self._vlm = vlm.to(self._device, self._dtype).eval()
        vision = vlm.config.vision_config
        self._image_size = vision.image_size
        self._mean = torch.tensor(mean, device=self._device).view(1, 3, 1, 1)
        self._std = torch.tensor(std, device=self._device).view(1, 3, 1, 1)
        self._yes, self._no = (_one_token(tokenizer, word, key)
                               for word, key in ((self.yes_word, "yes_word"), (self.no_word, "no_word")))
        self._ids = torch.tensor([prompt_ids(tokenizer, self.template.format(question=self.question),
                                             vlm.config.image_token_id, image_tokens(vlm.config))],
                                 device=self._device)
        self._upload = StagedUpload(self._device, self.max_batch, self.stages)

    def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """batch["frames"]: [n, H, W, 3·frame_stack] uint8. Returns [n] float32."""
        return self.start(batch).result()

    @torch.inference_mode()
    def start(self, batch: dict[str, np.ndarray]) -> Pending:
        if self._vlm is None:
            raise RewardModelError("VlmJudgeReward.setup(device) must run before labeling")
        rewards = [self._frame_rewards(self._upload(pieces, "frames", index % 2))
                   for index, pieces in enumerate(sub_batches(as_parts(batch["frames"]), self.max_batch))]
        rewards = torch.cat(rewards)
        return OnDevice(rewards) if rewards.is_cuda else Pending(rewards.numpy().astype(np.float32))

    def _frame_rewards(self, frames: torch.Tensor) -> torch.Tensor:
        """[n, H, W, 3k] uint8 on the device → [n] float32: one prefill forward, the last position's logits."""
        n, height, width = frames.shape[:3]
        # a stack's renders become consecutive images, in the order the template's <image> tokens take them
        frames = frames.view(n, height, width, self.frame_stack, 3).permute(0, 3, 1, 2, 4).reshape(-1, height, width, 3)
        pixels = clip_pixels(frames, self._image_size, self._mean, self._std, self._dtype)
        out = self._vlm(input_ids=self._ids.expand(n, -1), pixel_values=pixels, logits_to_keep=1, use_cache=False)
        return judge_scores(out.logits[:, -1], self._yes, self._no, self.score)


def image_tokens(config) -> int:
    """Image tokens a frame becomes: one per patch, and the class token where the projector keeps it ("full")."""
    vision = config.vision_config
    patches = (vision.image_size // vision.patch_size) ** 2
    return patches + (config.vision_feature_select_strategy == "full")


def prompt_ids(tokenizer, prompt: str, image_token_id: int, per_image: int) -> list[int]:
    """The prompt's token ids with each image token repeated `per_image` times (what LLaVA's processor does)."""
    ids = tokenizer(prompt).input_ids
    if image_token_id not in ids:
        raise RewardModelError(f"reward.template {prompt!r} has no image token the model's tokenizer knows "
                               f"(id {image_token_id}); write <image> where the frame goes")
    return [token for token_id in ids for token in ([token_id] * per_image if token_id == image_token_id else [token_id])]


def _one_token(tokenizer, word: str, key: str) -> int:
    ids = tokenizer.encode(word, add_special_tokens=False)
    if len(ids) != 1 or ids[0] == tokenizer.unk_token_id:
        raise RewardModelError(f"reward.{key}={word!r} is {len(ids)} tokens{' (unknown)' if len(ids) == 1 else ''} "
                               f"for this tokenizer; set reward.{key} to a word it keeps whole (e.g. Yes, No)")
    return ids[0]


def _load(model: str, device: torch.device, dtype: torch.dtype):
    """(model, tokenizer, image mean, image std) from a shape name, a local folder or the hub; one-line errors."""
    from rlfarm.rewards.vlm_factory import build_random_judge, is_shape

    if is_shape(model):
        try:
            return build_random_judge(model, str(device), dtype)
        except ValueError as error:
            raise RewardModelError(f"{error}; set reward.model=<one of them> or a model folder") from None
    from transformers import AutoConfig, AutoTokenizer, LlavaForConditionalGeneration

    path = os.path.expanduser(model)
    looks_local = os.path.isabs(path) or model.startswith(".") or os.path.exists(path)
    if looks_local and not os.path.isdir(path):
        raise RewardModelError(f"no VLM folder at {path!r}; set reward.model=/path/to/vlm (a save_pretrained folder)")
    try:
        config = AutoConfig.from_pretrained(path)
        if config.model_type != "llava":
            raise RewardModelError(f"reward.model {path!r} is a {config.model_type!r} model; the judge runs LLaVA-"
                                   "architecture models (model_type llava), e.g. llava-hf/llava-1.5-7b-hf")
        vlm = LlavaForConditionalGeneration.from_pretrained(path, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as error:
        reason = str(error).strip().splitlines()[0]
        raise RewardModelError(f"could not load VLM {path!r} ({reason}); save it with save_pretrained where there is "
                               "network and set reward.model=/path/to/vlm") from error
    return (vlm, tokenizer, *_pixel_stats(model))

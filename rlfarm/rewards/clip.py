"""CLIP goal-baseline reward (VLM-RMs: Rocamonde et al. 2023, "Vision-Language Models are Zero-Shot Reward
Models for Reinforcement Learning", eq. 3).

The reward is how close a frame's CLIP embedding lies to the goal prompt's, measured mostly along the
direction from a baseline prompt to the goal prompt: the baseline ("a cheetah") names what every frame
shows anyway, so the goal-minus-baseline direction isolates the task ("running fast").

One deliberate difference from the VLM-RMs code: the mean of several prompt embeddings is re-normalized,
so g and b lie on the unit sphere like x, and r = 1 exactly when the image embedding equals the goal.
Its throughput (frames/s per GPU, with and without compile) is in docs/benchmarks.md.
"""

import os

import numpy as np
import torch
import torch.nn.functional as F
from rlfarm.rewards.base import OnDevice, Pending, RewardModel, RewardModelError
from rlfarm.rewards.fp8 import require_fp8, to_fp8
from rlfarm.rewards.graphed import GraphedRows
from rlfarm.rewards.staging import StagedUpload, as_parts, sub_batches


def goal_baseline_reward(x: torch.Tensor, g: torch.Tensor, b: torch.Tensor, alpha: float) -> torch.Tensor:
    """r = 1 − ½‖(x − g)P‖²,  P = α·ddᵀ/‖d‖² + (1 − α)I,  d = g − b.

    x: [n, D] unit image embeddings; g, b: [D] unit goal and baseline embeddings; alpha in [0, 1]:
    0 is plain cosine similarity (1 − ½‖x − g‖² = x·g), 1 keeps only the component along d.
    Returns [n].
    """
    d = g - b
    identity = torch.eye(d.numel(), dtype=d.dtype, device=d.device)
    projection = alpha * torch.outer(d, d) / d.dot(d) + (1 - alpha) * identity
    return 1 - 0.5 * ((x - g) @ projection).pow(2).sum(dim=-1)


def clip_pixels(frames: torch.Tensor, image_size: int, mean: torch.Tensor, std: torch.Tensor,
                dtype: torch.dtype) -> torch.Tensor:
    """[n, H, W, 3] uint8 → [n, 3, S, S] normalized pixels in `dtype` (CLIP's center crop + resize, on the frames'
    device); mean, std: [1, 3, 1, 1]."""
    pixels = frames.permute(0, 3, 1, 2).float() / 255
    height, width = pixels.shape[-2:]
    side = min(height, width)
    top, left = (height - side) // 2, (width - side) // 2
    pixels = pixels[..., top : top + side, left : left + side]
    if side != image_size:
        pixels = F.interpolate(pixels, size=(image_size, image_size), mode="bicubic", antialias=True,
                               align_corners=False)
    return ((pixels - mean) / std).to(dtype)


class ClipReward(RewardModel):
    """Goal-baseline CLIP reward of rendered frames.

    model: HF hub id or local `save_pretrained` folder of a CLIPModel and its tokenizer.
    goal_prompts, baseline_prompts: each averaged into one unit text embedding (computed once, in setup).
    frame_size: side of the frames runners render; frames are resized to the model's input size anyway.
    dtype: weights' dtype on CUDA ("bfloat16"); CPU always runs float32.
    compile: torch.compile the image tower (CUDA only). It compiles in `setup`, i.e. while the labeler starts, once
        for every sub-batch size (the batch dimension dynamic): a compile in the first calls would stall the whole
        pipeline for a minute (ViT-L/14) while env steps wait on credits, and a bus of a new size would compile again.
    max_batch: frames per forward pass, bounding activation memory for large labeler buses.
    cuda_graphs: capture preprocessing, tower and reward as CUDA graphs in `setup`, one per sub-batch size class
        (rlfarm/rewards/graphed.py; CUDA only): a sub-batch is one launch, not hundreds, so a labeler that shares its
        host with many runners keeps its GPU fed.
    precision: null (weights in `dtype`) or fp8: the image tower's linear layers in FP8 (rlfarm/rewards/fp8.py; Ada or
        Hopper GPUs only), compiled whatever `compile` says (the activations' quantization must be fused).
    """

    needs = ("frames",)
    takes_parts = ("frames",)  # the labeler hands over its chunks' frames as they are: one host copy, into staging

    def __init__(
        self,
        model: str,
        goal_prompts: list[str],
        baseline_prompts: list[str],
        alpha: float = 0.5,
        frame_size: int = 224,
        dtype: str = "bfloat16",
        compile: bool = False,
        max_batch: int = 512,
        cuda_graphs: bool = True,
        precision: str | None = None,
    ):
        self.model = model
        self.goal_prompts = list(goal_prompts)
        self.baseline_prompts = list(baseline_prompts)
        self.alpha = alpha
        self.frame_size = frame_size
        self.dtype = dtype
        self.compile = compile
        self.max_batch = max_batch
        self.cuda_graphs = cuda_graphs
        if precision not in (None, "fp8"):
            raise RewardModelError(f"reward.precision={precision!r} is not a tower precision; set it to null or fp8")
        self.precision = precision
        self._clip = None

    def setup(self, device: str) -> None:
        self._device = torch.device(device)
        if self.precision == "fp8":
            require_fp8(self._device)  # before seconds of loading
        on_cuda = self._device.type == "cuda"
        self._dtype = getattr(torch, self.dtype) if on_cuda else torch.float32
        clip, tokenizer = _load(self.model)
        self._clip = clip.to(self._device, self._dtype).eval()
        self._image_size = clip.config.vision_config.image_size
        mean, std = _pixel_stats(self.model)
        self._mean = torch.tensor(mean, device=self._device).view(1, 3, 1, 1)
        self._std = torch.tensor(std, device=self._device).view(1, 3, 1, 1)
        with torch.inference_mode():
            self._goal = self._embed_text(tokenizer, self.goal_prompts)
            self._baseline = self._embed_text(tokenizer, self.baseline_prompts)
        if torch.allclose(self._goal, self._baseline):
            raise RewardModelError(
                f"goal and baseline prompts embed identically ({self.goal_prompts} vs {self.baseline_prompts}); "
                "make reward.goal_prompts describe the task and reward.baseline_prompts only the scene"
            )
        if self.precision == "fp8":
            to_fp8(self._clip, only=("vision_model", "visual_projection"))  # the text tower ran once, above
        self._upload = StagedUpload(self._device, self.max_batch, self.stages)
        self._image_tower = self._embed_pixels
        self._rewards_of = self._frame_rewards
        if (self.compile or self.precision == "fp8") and on_cuda:
            self._image_tower = torch.compile(self._embed_pixels)
            self._compile_now()
        if self.cuda_graphs and on_cuda:
            with torch.inference_mode():
                self._rewards_of = GraphedRows(self._frame_rewards, (self.frame_size, self.frame_size, 3), torch.uint8,
                                               self._device, self.max_batch)

    def _compile_now(self) -> None:
        """Compile through the real call path (upload, preprocess, tower) on frames of the size runners render: a full
        sub-batch (a static graph), then another size (the recompile with the batch dimension symbolic, 2..max_batch),
        so no later bus compiles. Size 1 would specialize (a compile of its own): `_tower` pads it to two."""
        frames = np.zeros((max(self.max_batch, 2), self.frame_size, self.frame_size, 3), np.uint8)
        self({"frames": frames})
        self({"frames": frames[: max(self.max_batch // 2 + 1, 3)]})
        torch.cuda.synchronize(self._device)

    def _tower(self, pixels: torch.Tensor) -> torch.Tensor:
        if len(pixels) == 1 and self._image_tower is not self._embed_pixels:
            return self._image_tower(torch.cat([pixels, pixels]))[:1]  # contiguous, as every other batch
        return self._image_tower(pixels)

    def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """batch["frames"]: [n, H, W, 3] uint8. Returns [n] float32."""
        return self.start(batch).result()

    @torch.inference_mode()
    def start(self, batch: dict[str, np.ndarray]) -> Pending:
        """Queue the whole batch on the device and return without waiting for it (on CUDA): the labeler gathers
        and uploads its next bus while the tower runs on this one."""
        if self._clip is None:
            raise RewardModelError("ClipReward.setup(device) must run before labeling")
        rewards = []
        for index, pieces in enumerate(sub_batches(as_parts(batch["frames"]), self.max_batch)):
            rewards.append(self._rewards_of(self._upload(pieces, "frames", index % 2)))
        rewards = torch.cat(rewards)
        return OnDevice(rewards) if rewards.is_cuda else Pending(rewards.numpy().astype(np.float32))

    def _frame_rewards(self, frames: torch.Tensor) -> torch.Tensor:
        """[n, H, W, 3] uint8 frames on the device → [n] float32 rewards."""
        x = self._tower(self._preprocess(frames)).float()
        return goal_baseline_reward(F.normalize(x, dim=-1), self._goal, self._baseline, self.alpha)

    def _preprocess(self, frames: torch.Tensor) -> torch.Tensor:
        return clip_pixels(frames, self._image_size, self._mean, self._std, self._dtype)

    def _embed_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        """[n, 3, S, S] → [n, D] image embeddings (not normalized)."""
        return self._clip.visual_projection(self._clip.vision_model(pixel_values=pixels).pooler_output)

    def _embed_text(self, tokenizer, prompts: list[str]) -> torch.Tensor:
        """prompts → [D] float32 unit embedding: the re-normalized mean of the prompts' unit embeddings."""
        max_length = self._clip.config.text_config.max_position_embeddings
        tokens = tokenizer(prompts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        tokens = tokens.to(self._device)
        text = self._clip.text_model(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"])
        pooled = text.pooler_output
        embeddings = F.normalize(self._clip.text_projection(pooled).float(), dim=-1)
        return F.normalize(embeddings.mean(dim=0), dim=-1)


# transformers is imported inside the loaders: it takes seconds, and only labelers running CLIP need it.


def _load(model: str) -> tuple[torch.nn.Module, object]:
    """CLIPModel and tokenizer from a local folder or the hub, or a one-line RewardModelError."""
    from transformers import AutoTokenizer, CLIPModel

    path = os.path.expanduser(model)
    looks_local = os.path.isabs(path) or model.startswith(".") or os.path.exists(path)
    if looks_local and not os.path.isdir(path):
        raise RewardModelError(
            f"no CLIP model folder at {path!r}; set reward.model=/path/to/clip (a save_pretrained folder) or a hub id"
        )
    try:
        return CLIPModel.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as error:
        reason = str(error).strip().splitlines()[0]
        raise RewardModelError(
            f"could not load CLIP model {path!r} ({reason}); "
            "save it with save_pretrained where there is network and set reward.model=/path/to/clip"
        ) from error


def _load_vision(model: str) -> torch.nn.Module:
    """A CLIPModel (for its vision tower and projection) from a local save_pretrained folder, or a one-line
    RewardModelError. Local only: a frozen tower in a fitted reward must be the one it was fitted on."""
    from transformers import CLIPModel

    path = os.path.expanduser(model)
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise RewardModelError(f"no CLIP model folder at {path!r} (no config.json); "
                               "pass the save_pretrained folder of the CLIP model the reward was fitted on")
    try:
        return CLIPModel.from_pretrained(path)
    except (OSError, ValueError) as error:
        raise RewardModelError(f"could not load CLIP model {path!r}: {str(error).strip().splitlines()[0]}") from error


def _pixel_stats(model: str) -> tuple[list[float], list[float]]:
    """Per-channel mean and std from the model's preprocessor config; OpenAI CLIP's when it has none."""
    from transformers.image_processing_base import ImageProcessingMixin
    from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

    try:
        config, _ = ImageProcessingMixin.get_image_processor_dict(os.path.expanduser(model))
    except OSError:
        return list(OPENAI_CLIP_MEAN), list(OPENAI_CLIP_STD)
    return config.get("image_mean", list(OPENAI_CLIP_MEAN)), config.get("image_std", list(OPENAI_CLIP_STD))

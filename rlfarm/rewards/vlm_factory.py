"""Randomly initialised LLaVA-architecture judges of known shapes: built on the device in the labeler (a name ending in
`_shape`), or saved as a hub folder would be (`python -m rlfarm.rewards.vlm_factory --shape tiny_shape --out DIR`).

Nothing is downloaded: speed runs and CI build their judge from a config. The towers have real shapes, so frames/s
match released checkpoints of that size; the answers are noise. The tokenizer is word-level (built offline) and
knows the words of the default question; any other word is its unknown token.

Shapes (LLaVA architecture: CLIP vision tower → two-layer projector → causal LM over [prompt, image tokens, prompt]):
- `qwen2-vl-2b_shape`: Qwen2-VL-2B's sizes (a 32-layer, 1280-wide ViT, 675M; the Qwen2-1.5B language model) on 224-px
  frames, 256 image tokens. Not Qwen2-VL's own class: that one needs patchified pixels and per-sample 3-D rotary
  positions in the host loop; the compute per frame is what the shape is for.
- `llava-1.5-7b_shape`: LLaVA-1.5-7B (CLIP ViT-L/14 at 336 px, 576 image tokens; Llama-2-7B).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

SHAPE_SUFFIX = "_shape"
IMAGE_TOKEN = "<image>"
WORDS = ("USER", "ASSISTANT", ":", "?", ".", "Is", "is", "the", "a", "robot", "cheetah", "running", "fast", "moving",
         "forward", "doing", "it", "Answer", "yes", "no", "or", "Yes", "No", "this", "frame", "in", "image", "agent")
SPECIAL = ("<unk>", "<pad>", "<s>", "</s>", IMAGE_TOKEN)

# (vision tower, language model (model_type, sizes), frame side)
SHAPES = {
    "tiny_shape": (dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                        patch_size=8),
                   ("llama", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=64))),
    "qwen2-vl-2b_shape": (dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=16,
                               image_size=224, patch_size=14),
                          ("qwen2", dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936))),
    "llava-1.5-7b_shape": (dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                                image_size=336, patch_size=14),
                           ("llama", dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                          num_attention_heads=32, num_key_value_heads=32, vocab_size=32064))),
}
OPENAI_STATS = {"image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}


def is_shape(model: str) -> bool:
    return model.endswith(SHAPE_SUFFIX)


def shape_config(shape: str):
    """The LlavaConfig of a shape (the image token is the tokenizer's, inside the LM's vocabulary)."""
    from transformers import AutoConfig, LlavaConfig

    if shape not in SHAPES:
        raise ValueError(f"unknown judge shape {shape!r}; choose one of {', '.join(SHAPES)}")
    vision, (text_type, text) = SHAPES[shape]
    patches = (vision["image_size"] // vision["patch_size"]) ** 2
    return LlavaConfig(vision_config=AutoConfig.for_model("clip_vision_model", **vision),
                       text_config=AutoConfig.for_model(text_type, **text, pad_token_id=1, bos_token_id=2,
                                                        eos_token_id=3),
                       image_token_index=SPECIAL.index(IMAGE_TOKEN), image_seq_length=patches,
                       vision_feature_layer=-2, vision_feature_select_strategy="default")


def word_tokenizer():
    """A word-level fast tokenizer over WORDS (ids below every shape's vocabulary), `<image>` a special token."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate((*SPECIAL, *WORDS))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    core.add_special_tokens([AddedToken(IMAGE_TOKEN, special=True)])  # whole, not split at its punctuation
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>")


def build_random_judge(shape: str, device: str = "cpu", dtype=None, seed: int = 0):
    """(model, tokenizer, image mean, image std) of a shape, its weights random, built on `device` in `dtype`."""
    import torch
    from transformers import LlavaForConditionalGeneration

    config = shape_config(shape)
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlavaForConditionalGeneration._from_config(config, dtype=dtype or torch.float32)
    return model.eval(), word_tokenizer(), OPENAI_STATS["image_mean"], OPENAI_STATS["image_std"]


def save_random_judge(path: str | Path, shape: str = "tiny_shape", seed: int = 0) -> Path:
    """A shape saved as a hub folder would be: model, tokenizer, preprocessor_config.json."""
    model, tokenizer, mean, std = build_random_judge(shape, seed=seed)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    side = SHAPES[shape][0]["image_size"]
    (path / "preprocessor_config.json").write_text(json.dumps({"image_mean": mean, "image_std": std,
                                                               "crop_size": side}))
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="tiny_shape", choices=sorted(SHAPES))
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    print(save_random_judge(args.out, args.shape))

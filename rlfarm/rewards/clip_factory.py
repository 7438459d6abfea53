"""Randomly initialised CLIP models of known shapes, saved as a hub folder would be.

Nothing is downloaded at run time here, so speed tests and CI build their reward towers from a config:
`python -m rlfarm.rewards.clip_factory --shape vit-l-14 --out /tmp/clip-l14`, then
`rlfarm train reward=clip reward.model=/tmp/clip-l14`. The tokenizer is character-level (built offline);
the towers have the real shapes, so throughput figures match the released checkpoints'.
"""
from __future__ import annotations

import argparse
import json
import string
from pathlib import Path

# (vision tower, text tower, projection) per shape; ViT shapes follow OpenAI CLIP.
SHAPES = {
    "tiny": (dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=8),
             dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2), 8),
    "vit-b-16": (dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12, image_size=224, patch_size=16),
                 dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=8), 512),
    "vit-l-14": (dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16, image_size=224, patch_size=14),
                 dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12), 768),
}
OPENAI_STATS = {"image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}


def save_random_clip(path: str | Path, shape: str = "tiny", seed: int = 0) -> Path:
    import torch
    from transformers import CLIPConfig, CLIPModel, CLIPTokenizer

    if shape not in SHAPES:
        raise ValueError(f"unknown CLIP shape {shape!r}; choose one of {', '.join(SHAPES)}")
    vision, text, projection = SHAPES[shape]
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for char in string.ascii_lowercase + string.digits:
        vocab[char] = len(vocab)
        vocab[char + "</w>"] = len(vocab)
    config = CLIPConfig(text_config=dict(text, vocab_size=len(vocab), max_position_embeddings=77, bos_token_id=0,
                                         eos_token_id=1),
                        vision_config=vision, projection_dim=projection)
    torch.manual_seed(seed)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    CLIPModel(config).save_pretrained(path)
    CLIPTokenizer(vocab=vocab, merges=[]).save_pretrained(path)
    (path / "preprocessor_config.json").write_text(json.dumps(OPENAI_STATS | {"crop_size": vision["image_size"]}))
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    print(save_random_clip(args.out, args.shape))

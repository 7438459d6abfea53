"""A randomly initialised causal LM with a real tokenizer of its own, saved as a hub folder would be.

Nothing can be downloaded in tests or CI, yet `model=hf_lm model.source=<folder>` should run the very path a
pretrained checkpoint takes (AutoTokenizer + AutoModelForCausalLM, a chat template, a vocabulary that is not
the embedding size). So: a byte-level BPE tokenizer trained offline on a little arithmetic text, with Qwen's
special tokens (`<|endoftext|>` pad, `<|im_end|>` EOS) and a ChatML template, next to a Qwen2 model whose
vocabulary is padded to a multiple of 64 as released models do.
`python -m rlfarm.models.lm_factory --out /tmp/tiny-lm`, then `rlfarm train ... model=hf_lm model.source=/tmp/tiny-lm`.
`--vla`: a tiny Llava (CLIP vision tower + Qwen2, 300-token vocabulary) instead, for `model=hf_vla`;
`--vla --shape vitb16-qwen0.5b|vitl14-qwen0.5b [--device cuda]`: a VLA-sized one (CLIP ViT-B/16 or ViT-L/14 at
224 px + a Qwen2.5-0.5B-shaped text model; ~0.45B / ~0.67B parameters, bf16) for speed work (`rlfarm bench vla`).
"""
from __future__ import annotations

import argparse
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TRAINING_TEXT = [
    "What is 12 plus 30? The answer is 42.", "Tom has 5 apples and buys 7 more. How many apples does he have?",
    "A train travels 60 miles in 2 hours. What is its speed?", "#### 72", "The total is 3 + 4 = 7 dollars.",
    "user", "assistant", "system", "Answer with a number.", "0 1 2 3 4 5 6 7 8 9 10 100 1000",
]
TINY_QWEN2 = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 256, "tie_word_embeddings": True}


def build_tokenizer(vocab_size: int = 300, pad: bool = True, chat_template: bool = True):
    """A `PreTrainedTokenizerFast` (byte-level BPE: any text round-trips) trained on TRAINING_TEXT.
    pad=False leaves it without a pad token, as many decoder-only tokenizers are."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(TRAINING_TEXT, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>" if pad else None,
                                   chat_template=CHATML if chat_template else None)


def save_random_lm(path: str | Path, seed: int = 0, model_type: str = "qwen2", **config) -> Path:
    """Save the tokenizer and a random causal LM (TINY_QWEN2 shape, overridable by `config`) under `path`."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    tokenizer = build_tokenizer()
    vocab_size = -(-len(tokenizer) // 64) * 64  # padded past the tokenizer, as Qwen2.5 (151936 rows, 151665 tokens)
    fields = {**TINY_QWEN2, **config, "vocab_size": vocab_size, "eos_token_id": tokenizer.eos_token_id,
              "pad_token_id": tokenizer.pad_token_id, "bos_token_id": None}
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **fields))
    # as Qwen2.5-Instruct's generation config: a chat turn ends at <|im_end|>, raw text at <|endoftext|>
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# Vision towers and text models of the VLA shapes (`--vla --shape NAME`). "tiny" is the unit tests' ~50k-parameter
# Llava; the others are random-weight, VLA-sized stand-ins for speed work (no checkpoint can be downloaded here):
# a CLIP ViT at 224 px (Llava's and OpenVLA's input side; 14-px patches give 256 picture tokens, as OpenVLA's
# DINOv2/SigLIP towers do) before a Qwen2.5-0.5B-shaped text model (hidden 896, 24 layers, 14 query / 2 KV heads,
# MLP 4864). Their vocabulary is small (the BPE tokenizer's ids, an <image> token, then 256 action-bin ids), so
# the parameters are those of the towers, not of a 151,936-row embedding.
CLIP_VIT_B16 = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
                "image_size": 224, "patch_size": 16, "projection_dim": 512}
CLIP_VIT_L14 = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
                "image_size": 224, "patch_size": 14, "projection_dim": 768}
QWEN25_05B = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
              "num_key_value_heads": 2, "max_position_embeddings": 4096, "rope_theta": 1000000.0,
              "rms_norm_eps": 1e-6, "tie_word_embeddings": True}
VLA_SHAPES = {
    "tiny": None,                                                   # save_random_llava's default: CPU tests
    "vitb16-qwen0.5b": (CLIP_VIT_B16, QWEN25_05B),                 # ~0.45B parameters, 196 picture tokens
    "vitl14-qwen0.5b": (CLIP_VIT_L14, QWEN25_05B),                 # ~0.67B parameters, 256 picture tokens
}
ACTION_BINS = 256


def save_random_llava(path: str | Path, seed: int = 0, shape: str = "tiny", dtype: str | None = None,
                      device: str = "cpu") -> Path:
    """A random-weight Llava (CLIP vision tower + Qwen2 text model) and the BPE tokenizer under `path`: an
    `hf_vla` checkpoint. shape="tiny": ~50k parameters (32-px pictures in 16 patches, 300 tokens, the last 256 serve
    as action bins). Other shapes (VLA_SHAPES): VLA-sized, saved in `dtype` (default bfloat16: 0.9–1.3 GB),
    built on `device` (a GPU initialises ~0.7B parameters in a second; the CPU takes tens of seconds)."""
    import torch
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration, Qwen2Config

    if shape not in VLA_SHAPES:
        raise ValueError(f"unknown VLA shape {shape!r}: one of {', '.join(VLA_SHAPES)}")
    path = Path(path)
    torch.manual_seed(seed)
    if VLA_SHAPES[shape] is None:
        vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                  image_size=32, patch_size=8, projection_dim=32)
        text = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=2, vocab_size=300, max_position_embeddings=128)
        config = LlavaConfig(vision_config=vision, text_config=text, image_token_id=2, vision_feature_layer=-1,
                             vision_feature_select_strategy="default")
        LlavaForConditionalGeneration(config).save_pretrained(path)
        build_tokenizer(vocab_size=300).save_pretrained(path)
        return path
    vision_fields, text_fields = VLA_SHAPES[shape]
    tokenizer = build_tokenizer(vocab_size=300)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    image_token_id = tokenizer.convert_tokens_to_ids("<image>")
    # text ids first (padded to a multiple of 64), then the action bins: no bin shares an id with text
    vocab_size = -(-len(tokenizer) // 64) * 64 + ACTION_BINS
    text = Qwen2Config(**text_fields, vocab_size=vocab_size, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    config = LlavaConfig(vision_config=CLIPVisionConfig(**vision_fields), text_config=text,
                         image_token_id=image_token_id, vision_feature_layer=-2,  # Llava's: the last layer but one
                         vision_feature_select_strategy="default", projector_hidden_act="gelu",
                         tie_word_embeddings=True)
    saved = getattr(torch, dtype or "bfloat16")
    with torch.device(device):
        model = LlavaForConditionalGeneration(config)
    model.to(saved).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def count_parameters(path: str | Path) -> int:
    """Parameters of a saved checkpoint, read from its safetensors headers (nothing is loaded)."""
    import json
    import struct

    total = 0
    for file in Path(path).glob("*.safetensors"):
        with open(file, "rb") as handle:
            header = json.loads(handle.read(struct.unpack("<Q", handle.read(8))[0]))
        for name, entry in header.items():
            if name != "__metadata__":
                count = 1
                for side in entry["shape"]:
                    count *= side
                total += count
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder to write (model + tokenizer)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vla", action="store_true", help="a Llava for model=hf_vla instead of a causal LM")
    parser.add_argument("--shape", default="tiny", choices=list(VLA_SHAPES), help="with --vla: the Llava's shape")
    parser.add_argument("--dtype", default=None, help="with --vla: the saved dtype (VLA-sized shapes: bfloat16)")
    parser.add_argument("--device", default="cpu", help="with --vla: where the weights are initialised (cuda: fast)")
    args = parser.parse_args()
    if args.vla:
        path = save_random_llava(args.out, args.seed, args.shape, args.dtype, args.device)
        print(f"{path} ({args.shape}, {count_parameters(path) / 1e6:.1f}M parameters)")
    else:
        print(save_random_lm(args.out, args.seed))


if __name__ == "__main__":
    main()

"""A randomly initialised causal LM with a real tokenizer of its own, saved as a hub folder would be.

Nothing can be downloaded in tests or CI, yet `model=hf_lm model.source=<folder>` should run the very path a
pretrained checkpoint takes (AutoTokenizer + AutoModelForCausalLM, a chat template, a vocabulary that is not
the embedding size). So: a byte-level BPE tokenizer trained offline on a little arithmetic text, with Qwen's
special tokens (`<|endoftext|>` pad, `<|im_end|>` EOS) and a ChatML template, next to a Qwen2 model whose
vocabulary is padded to a multiple of 64 as released models do.
`python -m rlfarm.models.lm_factory --out /tmp/tiny-lm`, then `rlfarm train ... model=hf_lm model.source=/tmp/tiny-lm`.
`--vla`: a tiny Llava (CLIP vision tower + Qwen2, 300-token vocabulary) instead, for `model=hf_vla`.
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


def save_random_llava(path: str | Path, seed: int = 0) -> Path:
    """A ~50k-parameter Llava (CLIP vision tower on 32-px pictures in 16 patches + a Qwen2 text model, 300
    tokens: the last 256 serve as action bins) and the BPE tokenizer, under `path`: an `hf_vla` checkpoint."""
    import torch
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration, Qwen2Config

    path = Path(path)
    torch.manual_seed(seed)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                              image_size=32, patch_size=8, projection_dim=32)
    text = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=2, vocab_size=300, max_position_embeddings=128)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_id=2, vision_feature_layer=-1,
                         vision_feature_select_strategy="default")
    LlavaForConditionalGeneration(config).save_pretrained(path)
    build_tokenizer(vocab_size=300).save_pretrained(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder to write (model + tokenizer)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vla", action="store_true", help="a tiny Llava for model=hf_vla instead of a causal LM")
    args = parser.parse_args()
    print((save_random_llava if args.vla else save_random_lm)(args.out, args.seed))


if __name__ == "__main__":
    main()

"""A Hugging Face tokenizer behind the small interface the on-policy roles use (the one `DigitTokenizer` has):
`encode(text, add_bos)`, `decode(ids, skip_special_tokens)`, `pad_id`, `eos_id`, `stop_ids`, `bos_id`, `vocab_size`.

Why an adapter and not the HF tokenizer itself: the roles need three facts the HF object states loosely.
- `pad_id` must exist (the engine left-pads prompts): many decoder-only tokenizers have no pad token, and
  any id will do there because padded positions are masked, so it falls back to EOS.
- `vocab_size` sizes tensors, so it is the model's embedding rows (its config's `vocab_size`, e.g. 151936 for
  Qwen2.5), not `len(tokenizer)` (151665): models pad their vocabulary to a round number.
- `stop_ids` are every token that ends an answer: the tokenizer's EOS plus the model's generation config's
  (Qwen2.5-Instruct: `<|im_end|>` and `<|endoftext|>`; stopping at the first alone lets a chat model run on).
- `decode` skips special tokens by default: the verifier must read the answer text, not `<|im_end|>` or pads
  (the scorer calls `decode(ids)` with no flag; `DigitTokenizer` keeps them, which its position-wise reward needs).
"""
from __future__ import annotations

from collections.abc import Sequence

from rlfarm.data import stop_ids


def generation_stop_ids(source: str) -> tuple[int, ...]:
    """The EOS ids of the model's generation config (`generation_config.json`), () when it has none."""
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(source).eos_token_id
    except OSError:  # no generation_config.json: the tokenizer's EOS is all there is
        return ()
    return stop_ids(eos)


class HFTokenizer:
    """Wraps a `transformers` tokenizer; `vocab_size` is the model's (defaults to `len(tokenizer)`)."""

    def __init__(self, tokenizer, vocab_size: int | None = None, stops: Sequence[int] = ()):
        self.tokenizer = tokenizer
        if tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has no EOS token: generation could never stop")
        self.eos_id = int(tokenizer.eos_token_id)
        self.stop_ids = stop_ids((self.eos_id, *stops))
        self.pad_id = int(tokenizer.pad_token_id) if tokenizer.pad_token_id is not None else self.eos_id
        self.bos_id = int(tokenizer.bos_token_id) if tokenizer.bos_token_id is not None else None
        self.vocab_size = int(vocab_size) if vocab_size is not None else len(tokenizer)
        if len(tokenizer) > self.vocab_size:
            raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has {len(tokenizer)} tokens but the model only "
                             f"{self.vocab_size} embedding rows: they do not belong together")

    @classmethod
    def from_pretrained(cls, source: str) -> HFTokenizer:
        """The tokenizer saved with a model (local folder or hub id), sized by that model's config."""
        from transformers import AutoConfig, AutoTokenizer

        config = AutoConfig.from_pretrained(source)
        vocab_size = getattr(config.get_text_config(), "vocab_size", None)
        return cls(AutoTokenizer.from_pretrained(source), vocab_size, generation_stop_ids(source))

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of `text`, with the BOS token first when asked and the tokenizer has one. Special tokens
        written in the text (a chat template's `<|im_start|>`) become their ids; nothing else is added."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return [self.bos_id, *ids] if add_bos and self.bos_id is not None else list(ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def chat_prompt(self, question: str) -> str:
        """The question as one user turn in the tokenizer's chat template, ending where the assistant's
        answer starts (add_generation_prompt)."""
        if not self.tokenizer.chat_template:
            raise ValueError(f"tokenizer {self.tokenizer.name_or_path!r} has no chat template "
                             f"(set env.chat_template=false to send the question as plain text)")
        return self.tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                                  add_generation_prompt=True)

    def encode_question(self, question: str, chat_template: bool = False) -> list[int]:
        """A prompt's ids: plain text with BOS, or the chat template (which writes its own BOS, if any)."""
        if chat_template:
            return self.encode(self.chat_prompt(question), add_bos=False)
        return self.encode(question)

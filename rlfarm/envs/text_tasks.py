"""Verifiable text tasks: synthetic digit tasks a tiny model learns from scratch, and prompt files.

Digit tasks (`copy`, `reverse`, `add`) speak a character-level vocabulary (`DigitTokenizer`); a prompt is
BOS + question + '=' and the answer is the text the policy should write before EOS, e.g.
copy: "^3141=" → "3141", reverse: "^3141=" → "1413", add: "^0042+0815=" → "857".
`copy_var` copies 1 … num_digits digits (the count drawn per prompt): answers of varied length, so a decoder's
rows end at different steps on real end tokens (what continuous refill is tested on, on CPU).
`PromptDataset` reads question/answer records (GSM8K-style) from local JSONL or Parquet; `PromptTask` serves
them to a policy through its own Hugging Face tokenizer (`rlfarm.envs.hf_tokenizer.HFTokenizer`, which digit
tasks can speak too). `TextTaskSpec` is what an on-policy role is told, `text_task` builds the task from it.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


class DigitTokenizer:
    """One token per character: PAD '_', BOS '^', EOS '$', digits, '+', '='.

    Special tokens decode to their own character (unless skipped), so a decoded completion has one
    character per generated token and position-wise rewards line up with positions the model wrote. Ids past the
    vocabulary (a model with more rows: `model.vocab=shape` speed runs) decode to '?'.
    """

    pad_id, bos_id, eos_id = 0, 1, 2
    stop_ids = (eos_id,)
    _chars = "_^$0123456789+="

    def __init__(self):
        self._ids = {char: i for i, char in enumerate(self._chars)}

    @property
    def vocab_size(self) -> int:
        return len(self._chars)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        unknown = sorted(set(text) - set(self._chars))
        if unknown:
            raise ValueError(f"DigitTokenizer cannot encode {''.join(unknown)!r} (vocabulary: {self._chars!r})")
        return [self.bos_id] * add_bos + [self._ids[char] for char in text]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        special = {self.pad_id, self.bos_id, self.eos_id}
        return "".join(self._chars[int(i)] if int(i) < len(self._chars) else "?" for i in ids
                       if not (skip_special_tokens and int(i) in special))


@dataclass(frozen=True)
class PromptBatch:
    """prompt_ids[i] (token ids, unpadded) asks for answers[i] (reference text for the verifier)."""

    prompt_ids: list[list[int]]
    answers: list[str]


def _copy(rng: np.random.Generator, num_digits: int) -> tuple[str, str]:
    digits = "".join(map(str, rng.integers(0, 10, num_digits)))
    return digits + "=", digits


def _reverse(rng: np.random.Generator, num_digits: int) -> tuple[str, str]:
    digits = "".join(map(str, rng.integers(0, 10, num_digits)))
    return digits + "=", digits[::-1]


def _copy_var(rng: np.random.Generator, num_digits: int) -> tuple[str, str]:
    digits = "".join(map(str, rng.integers(0, 10, int(rng.integers(1, num_digits + 1)))))
    return digits + "=", digits


def _add(rng: np.random.Generator, num_digits: int) -> tuple[str, str]:
    # Operands are zero-padded so every prompt of a task has the same length.
    a, b = (int(x) for x in rng.integers(0, 10 ** num_digits, 2))
    return f"{a:0{num_digits}d}+{b:0{num_digits}d}=", str(a + b)


DIGIT_TASKS: dict[str, Callable[[np.random.Generator, int], tuple[str, str]]] = {
    "copy": _copy, "reverse": _reverse, "add": _add, "copy_var": _copy_var,
}


class DigitTask:
    """A seeded stream of prompts for one digit task. `max_answer_len` bounds the answer (without EOS).

    tokenizer: None speaks `DigitTokenizer`; an `HFTokenizer` lets a pretrained model take the task."""

    def __init__(self, name: str, num_digits: int = 4, seed: int = 0, tokenizer: Any = None):
        if name not in DIGIT_TASKS:
            raise KeyError(f"unknown digit task {name!r}; known: {', '.join(DIGIT_TASKS)}")
        self.name, self.num_digits = name, num_digits
        self.tokenizer = tokenizer or DigitTokenizer()
        self.max_answer_len = num_digits + 1 if name == "add" else num_digits
        self._make = DIGIT_TASKS[name]
        self._rng = np.random.default_rng(seed)

    @property
    def max_new_tokens(self) -> int:
        """The longest answer + EOS (in characters, which is in tokens for DigitTokenizer)."""
        return self.max_answer_len + 1

    def sample(self, batch_size: int) -> PromptBatch:
        pairs = [self._make(self._rng, self.num_digits) for _ in range(batch_size)]
        return PromptBatch([self.tokenizer.encode(q) for q, _ in pairs], [a for _, a in pairs])


class PromptDataset:
    """Question/answer text records; `sample` draws a seeded batch and tokenizes the questions."""

    def __init__(self, questions: Sequence[str], answers: Sequence[str], seed: int = 0):
        if len(questions) != len(answers) or not questions:
            raise ValueError(f"need as many answers as questions (>0), got {len(questions)} and {len(answers)}")
        self.questions, self.answers = list(questions), list(answers)
        self._rng = np.random.default_rng(seed)

    @classmethod
    def from_file(cls, path: str | Path, question_field: str = "question", answer_field: str = "answer",
                  seed: int = 0) -> PromptDataset:
        """Read a .jsonl/.json-lines or .parquet file whose records have the two fields (answers become str)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"prompt file not found: {path}")
        records = _read_records(path)
        if not records:
            raise ValueError(f"{path}: no records")
        for row, record in enumerate(records):
            for field in (question_field, answer_field):
                if field not in record:
                    raise KeyError(f"{path}: record {row} has no field {field!r} (fields: {', '.join(record)})")
        return cls([str(r[question_field]) for r in records], [str(r[answer_field]) for r in records], seed)

    def __len__(self) -> int:
        return len(self.questions)

    def sample(self, batch_size: int, tokenizer, chat_template: bool = False) -> PromptBatch:
        """`tokenizer.encode(text) -> list[int]` (HFTokenizer or DigitTokenizer); chat_template: each question
        as a user turn of the tokenizer's chat template (`HFTokenizer.encode_question`)."""
        rows = self._rng.integers(0, len(self), batch_size)
        questions = [self.questions[i] for i in rows]
        prompts = ([tokenizer.encode_question(q, chat_template=True) for q in questions] if chat_template
                   else [list(tokenizer.encode(q)) for q in questions])
        return PromptBatch(prompts, [self.answers[i] for i in rows])


class PromptTask:
    """A prompt file as a task: seeded batches of its questions in the policy's tokenizer; answers are free text
    of up to `max_new_tokens` tokens (EOS included), scored by a verifier against the file's answers."""

    def __init__(self, dataset: PromptDataset, tokenizer, max_new_tokens: int, chat_template: bool = False):
        self.dataset, self.tokenizer = dataset, tokenizer
        self.max_new_tokens, self.chat_template = int(max_new_tokens), bool(chat_template)
        if chat_template:
            tokenizer.chat_prompt("")  # fails now, with the fix, if the tokenizer has no template

    def sample(self, batch_size: int) -> PromptBatch:
        return self.dataset.sample(batch_size, self.tokenizer, self.chat_template)


@dataclass(frozen=True)
class TextTaskSpec:
    """What an on-policy role is told about its task (plain values, so it travels to Ray actors).

    task: a digit task name (copy | reverse | add) or "prompts" (a prompt file at `path`).
    tokenizer: hub id / folder of the policy's HF tokenizer (`model.source`); None: `DigitTokenizer`.
    """

    task: str = "copy"
    num_digits: int = 4
    path: str | None = None
    question_field: str = "question"
    answer_field: str = "answer"
    max_new_tokens: int = 256
    chat_template: bool = False
    tokenizer: str | None = None
    seed: int = 0


PROMPTS = "prompts"


def text_tokenizer(spec: TextTaskSpec):
    """The tokenizer the task speaks: the policy's own (HF) or the digit vocabulary."""
    if spec.tokenizer is None:
        if spec.task == PROMPTS:
            raise ValueError("prompt files need a tokenizer: use model=hf_lm model.source=<path>")
        return DigitTokenizer()
    from rlfarm.envs.hf_tokenizer import HFTokenizer

    return HFTokenizer.from_pretrained(spec.tokenizer)


def text_task(spec: TextTaskSpec) -> DigitTask | PromptTask:
    tokenizer = text_tokenizer(spec)
    if spec.task == PROMPTS:
        dataset = PromptDataset.from_file(spec.path, spec.question_field, spec.answer_field, seed=spec.seed)
        return PromptTask(dataset, tokenizer, spec.max_new_tokens, spec.chat_template)
    return DigitTask(spec.task, spec.num_digits, seed=spec.seed, tokenizer=tokenizer)


def _read_records(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ImportError(f"reading {path} needs pyarrow: pip install pyarrow") from None
        return pq.read_table(path).to_pylist()
    if path.suffix in (".jsonl", ".json"):
        with path.open() as lines:
            return [json.loads(line) for line in lines if line.strip()]
    raise ValueError(f"{path}: unsupported prompt file type {path.suffix!r} (use .jsonl or .parquet)")

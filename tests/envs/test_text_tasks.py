import json

import pytest

from rlfarm.envs.text_tasks import DigitTask, DigitTokenizer, PromptDataset


def test_tokenizer_round_trip_one_token_per_character():
    tokenizer = DigitTokenizer()
    ids = tokenizer.encode("12+34=")
    assert ids[0] == tokenizer.bos_id and len(ids) == 7
    assert tokenizer.decode(ids) == "^12+34="
    assert tokenizer.decode(ids, skip_special_tokens=True) == "12+34="
    assert tokenizer.decode([tokenizer.eos_id, tokenizer.pad_id, 3]) == "$_0"
    assert tokenizer.vocab_size == 15 and len(set(tokenizer.encode("0123456789+=", add_bos=False))) == 12
    with pytest.raises(ValueError, match="cannot encode 'x'"):
        tokenizer.encode("1x2")


@pytest.mark.parametrize("name, answer_of", [
    ("copy", lambda q: q[:-1]),
    ("reverse", lambda q: q[:-1][::-1]),
    ("add", lambda q: str(int(q[:-1].split("+")[0]) + int(q[:-1].split("+")[1]))),
])
def test_digit_tasks_answer_their_prompts(name, answer_of):
    task = DigitTask(name, num_digits=4, seed=0)
    batch = task.sample(32)
    assert len(batch.prompt_ids) == len(batch.answers) == 32
    assert len({len(p) for p in batch.prompt_ids}) == 1  # fixed-length prompts
    for ids, answer in zip(batch.prompt_ids, batch.answers):
        question = task.tokenizer.decode(ids, skip_special_tokens=True)
        assert question.endswith("=") and answer == answer_of(question)
        assert len(answer) <= task.max_answer_len


def test_digit_tasks_are_seeded():
    assert DigitTask("copy", seed=3).sample(8) == DigitTask("copy", seed=3).sample(8)
    assert DigitTask("copy", seed=3).sample(8) != DigitTask("copy", seed=4).sample(8)
    with pytest.raises(KeyError, match="known: copy, reverse, add"):
        DigitTask("sort")


def test_prompt_dataset_from_jsonl(tmp_path):
    path = tmp_path / "gsm.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"question": "1+1=", "answer": "so #### 2"}, {"question": "2+2=", "answer": 4}]) + "\n")
    dataset = PromptDataset.from_file(path, seed=0)
    assert len(dataset) == 2 and dataset.answers == ["so #### 2", "4"]
    batch = dataset.sample(5, DigitTokenizer())
    assert len(batch.prompt_ids) == 5
    records = [("1+1=", "so #### 2"), ("2+2=", "4")]
    for ids, answer in zip(batch.prompt_ids, batch.answers):
        assert (DigitTokenizer().decode(ids, skip_special_tokens=True), answer) in records


def test_prompt_dataset_errors_are_one_line(tmp_path):
    with pytest.raises(FileNotFoundError) as missing:
        PromptDataset.from_file(tmp_path / "nope.jsonl")
    assert str(missing.value) == f"prompt file not found: {tmp_path / 'nope.jsonl'}"
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"question": "q", "solution": "a"}) + "\n")
    with pytest.raises(KeyError) as no_field:
        PromptDataset.from_file(path)
    assert "record 0 has no field 'answer' (fields: question, solution)" in str(no_field.value)
    assert "\n" not in str(no_field.value)
    with pytest.raises(ValueError, match="unsupported prompt file type '.csv'"):
        (tmp_path / "x.csv").write_text("q,a\n")
        PromptDataset.from_file(tmp_path / "x.csv")


def test_prompt_dataset_from_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "gsm.parquet"
    pq.write_table(pa.table({"problem": ["3+4="], "answer": ["7"]}), path)
    dataset = PromptDataset.from_file(path, question_field="problem")
    assert dataset.questions == ["3+4="] and dataset.answers == ["7"]


# ---- a pretrained model's own tokenizer (HFTokenizer), built offline by rlfarm.models.lm_factory


@pytest.fixture(scope="module")
def lm_folder(tmp_path_factory):
    from rlfarm.models.lm_factory import save_random_lm

    return save_random_lm(tmp_path_factory.mktemp("lm") / "tiny-lm")


@pytest.fixture(scope="module")
def hf_tokenizer(lm_folder):
    from rlfarm.envs.hf_tokenizer import HFTokenizer

    return HFTokenizer.from_pretrained(str(lm_folder))


def test_hf_tokenizer_round_trip_and_sizes_from_the_model(hf_tokenizer):
    text = "What is 12 plus 30? He pays $7.50, so 3 + 4 = 7 #### 72 (ünïcode too)"
    ids = hf_tokenizer.encode(text)
    assert hf_tokenizer.decode(ids) == text and len(ids) < len(text)  # BPE: fewer tokens than characters
    assert hf_tokenizer.bos_id is None and ids == hf_tokenizer.encode(text, add_bos=False)  # Qwen-style: no BOS
    assert (hf_tokenizer.eos_id, hf_tokenizer.pad_id) == (2, 0)  # <|im_end|>, <|endoftext|>
    assert hf_tokenizer.stop_ids == (0, 2)  # both end a sample, from the model's generation config
    # the model's embedding rows (padded to a multiple of 64), not len(tokenizer): this sizes tensors
    assert hf_tokenizer.vocab_size == 320 and len(hf_tokenizer.tokenizer) == 300
    # a completion ends in EOS and padding: decoding skips them by default, so a verifier sees only the text
    assert hf_tokenizer.decode(ids + [hf_tokenizer.eos_id, hf_tokenizer.pad_id]) == text
    assert hf_tokenizer.decode([hf_tokenizer.eos_id], skip_special_tokens=False) == "<|im_end|>"


def test_hf_tokenizer_pad_falls_back_to_eos_and_bos_is_prepended():
    from rlfarm.envs.hf_tokenizer import HFTokenizer
    from rlfarm.models.lm_factory import build_tokenizer

    no_pad = HFTokenizer(build_tokenizer(pad=False))
    assert no_pad.pad_id == no_pad.eos_id == 2 and no_pad.vocab_size == len(no_pad.tokenizer)
    assert no_pad.stop_ids == (2,)  # no generation config: the tokenizer's EOS alone
    with_bos = build_tokenizer()
    with_bos.bos_token = "<|im_start|>"
    tokenizer = HFTokenizer(with_bos)
    assert tokenizer.encode("7")[0] == tokenizer.bos_id == 1 and tokenizer.encode("7", add_bos=False)[0] != 1
    with pytest.raises(ValueError, match="300 tokens but the model only 100 embedding rows"):
        HFTokenizer(build_tokenizer(), vocab_size=100)
    no_eos = build_tokenizer()
    no_eos.eos_token = None
    with pytest.raises(ValueError, match="has no EOS token"):
        HFTokenizer(no_eos)


def test_hf_tokenizer_chat_template_asks_for_the_assistant_turn(hf_tokenizer):
    from rlfarm.envs.hf_tokenizer import HFTokenizer
    from rlfarm.models.lm_factory import build_tokenizer

    prompt = hf_tokenizer.chat_prompt("What is 2 plus 3?")
    assert prompt == "<|im_start|>user\nWhat is 2 plus 3?<|im_end|>\n<|im_start|>assistant\n"
    ids = hf_tokenizer.encode_question("What is 2 plus 3?", chat_template=True)
    assert ids[0] == 1 and ids.count(hf_tokenizer.eos_id) == 1  # the template's special tokens are single ids
    assert hf_tokenizer.decode(ids, skip_special_tokens=False) == prompt
    assert hf_tokenizer.encode_question("What is 2 plus 3?") == hf_tokenizer.encode("What is 2 plus 3?")
    with pytest.raises(ValueError, match="has no chat template .*env.chat_template=false"):
        HFTokenizer(build_tokenizer(chat_template=False)).chat_prompt("hi")


def test_prompt_task_asks_the_file_questions_in_the_model_tokenizer(tmp_path, lm_folder, hf_tokenizer):
    from rlfarm.envs.text_tasks import PromptTask, TextTaskSpec, text_task, text_tokenizer

    path = tmp_path / "arith.jsonl"
    records = [{"q": f"What is {i} plus {i}?", "a": f"#### {2 * i}"} for i in range(5)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    spec = TextTaskSpec("prompts", path=str(path), question_field="q", answer_field="a", max_new_tokens=12,
                        chat_template=True, tokenizer=str(lm_folder), seed=1)
    task = text_task(spec)
    assert isinstance(task, PromptTask) and task.max_new_tokens == 12 and task.tokenizer.vocab_size == 320
    batch = task.sample(8)
    assert batch == text_task(spec).sample(8)  # seeded
    for ids, answer in zip(batch.prompt_ids, batch.answers):
        question = next(r["q"] for r in records if r["a"] == answer)
        assert ids == hf_tokenizer.encode_question(question, chat_template=True)
    plain = text_task(TextTaskSpec("prompts", path=str(path), question_field="q", answer_field="a",
                                   tokenizer=str(lm_folder))).sample(2)
    assert all(hf_tokenizer.decode(ids).startswith("What is") for ids in plain.prompt_ids)
    with pytest.raises(ValueError, match="prompt files need a tokenizer: use model=hf_lm model.source=<path>"):
        text_tokenizer(TextTaskSpec("prompts", path=str(path)))


def test_digit_tasks_speak_an_hf_tokenizer_too(lm_folder, hf_tokenizer):
    from rlfarm.envs.text_tasks import TextTaskSpec, text_task

    task = text_task(TextTaskSpec("add", num_digits=3, tokenizer=str(lm_folder), seed=0))
    batch = task.sample(4)
    assert task.max_new_tokens == 5 and task.tokenizer is not None
    for ids, answer in zip(batch.prompt_ids, batch.answers):
        a, b = hf_tokenizer.decode(ids).rstrip("=").split("+")
        assert int(a) + int(b) == int(answer)
    assert isinstance(text_task(TextTaskSpec("copy")).tokenizer, DigitTokenizer)


def test_prompt_file_without_records_says_so(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="empty.jsonl: no records"):
        PromptDataset.from_file(tmp_path / "empty.jsonl")

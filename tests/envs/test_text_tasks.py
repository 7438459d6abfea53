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
